"""The host C compiler: find it, and turn the C target's source into a shared library.

Why apart from native.py: this is the only module that runs a compiler, so its flags, its
identity (what a cache key must include) and its error messages live in one place, and tests can
count or fake compiles by patching `compile_shared`.

Which compiler: $CC (may carry arguments, e.g. `ccache gcc`), else the first of cc, gcc, clang on
PATH. Flags (FLAGS):
  -O3 -march=native      vectorise for this CPU (the cache key holds its feature flags)
  -mprefer-vector-width=512  with AVX-512: gcc's Intel server tunings otherwise use 256-bit
                         vectors (a fp32 GEMM built with -march=sapphirerapids ran on ymm)
  -fopenmp               the blocks of a kernel run on every core (`omp parallel for`), and
                         `omp simd reduction` vectorises float reductions without -ffast-math
  -fPIC -shared -std=c11 a library ctypes loads; the emitter writes C11
  -fno-math-errno        libm calls never set errno: sqrt is one instruction, and loops of
                         sqrt/rsqrt vectorise (gcc 12 keeps them scalar otherwise); same results
  -fno-trapping-math     FP exceptions are not observed, so floor/ceil/trunc vectorise and
                         conditional float code is if-converted; same results
  -DSTRATA_LIBMVEC -lmvec where glibc's vector math library exists (x86-64 Linux): the prelude
                         declares expf, tanhf, erff ... `omp declare simd`, so loops calling them
                         vectorise through libmvec (at most 4 ulp from libm's result: within every
                         tolerance; a softmax or SiLU loop ran 7x faster with it)
  -ffp-contract=off      no a * b + c fused into one FMA (the ISO C default, made explicit):
                         every elementwise result is rounded as the simulator rounds it, so the
                         two agree bit for bit (tests/runtime/test_native.py). Measured on the
                         2-core EPYC this was written on, best of 5 x 200 runs: rms_norm 64x4096
                         32.4 us off vs 34.0 us fast, row sums 16.8 vs 16.8 us, three 1M-element
                         kernels 320 vs 313 us: no difference beyond noise, as these kernels are
                         memory-bound. A compute-bound contraction would want FMA; the flags are
                         in the cache key, so a later schedule may turn it on.
"""
from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from ..core.errors import CompileError, DeviceUnavailable
from .c_prelude_pch import on_prelude_header


@lru_cache(maxsize=1)
def cpu_features() -> str:
    """This CPU's feature flags (-march=native compiles for them): the `flags` line of
    /proc/cpuinfo, else the platform's processor name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.partition(":")[2].split()))
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def vector_flags(features: str) -> tuple[str, ...]:
    """-mprefer-vector-width=512 where AVX-512 exists: the schedules plan 64-byte vectors, but
    gcc's Intel server tunings (-march=sapphirerapids) vectorise at 256 bits unless told so."""
    return ("-mprefer-vector-width=512",) if "avx512f" in features.split() else ()


FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11", "-fno-math-errno",
         "-fno-trapping-math", "-ffp-contract=off", *vector_flags(cpu_features()))
if platform.machine() in ("x86_64", "AMD64") and Path("/usr/lib/x86_64-linux-gnu/libmvec.so").exists() \
        or __import__("ctypes.util").util.find_library("mvec"):
    FLAGS += ("-DSTRATA_LIBMVEC",)
    LIBS: tuple[str, ...] = ("-lmvec", "-lm")         # after the source, where the linker wants them
else:
    LIBS = ()
SOURCE_NAME = "strata.c"       # the same name in every build, so identical sources give identical .so
COMPILES = 0                   # real compiles in this process (the cache tests count them)
_CANDIDATES = ("cc", "gcc", "clang")


def find_compiler() -> list[str]:
    """The compiler command: $CC split into words, else the first of cc, gcc, clang on PATH, with
    its path resolved. DeviceUnavailable (one sentence) when there is none."""
    env = os.environ.get("CC", "").strip()
    if env:
        words = shlex.split(env)
        path = shutil.which(words[0])
        if path is None:
            raise DeviceUnavailable(f"$CC is {env!r}, but {words[0]} is not an executable on "
                                    f"PATH; point CC at a C compiler (gcc or clang)")
        return [path, *words[1:]]
    for name in _CANDIDATES:
        path = shutil.which(name)
        if path:
            return [path]
    raise DeviceUnavailable("the CPU target needs a C compiler and none was found (no $CC, and "
                            "no cc, gcc or clang on PATH); install gcc (e.g. apt-get install gcc)")


def compiler_identity(cmd: list[str]) -> dict:
    """What the cache key records about the compiler: its resolved path, its arguments and the
    first lines of `--version` (an upgrade in place changes them)."""
    exe = os.path.realpath(cmd[0])
    st = os.stat(exe)
    return {"path": exe, "args": cmd[1:], "version": _version(tuple(cmd), exe, st.st_mtime_ns)}


@lru_cache(maxsize=8)
def _version(cmd: tuple[str, ...], exe: str, mtime_ns: int) -> str:
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60,
                             check=False)
    except (OSError, subprocess.SubprocessError) as e:
        raise DeviceUnavailable(f"the C compiler {cmd[0]} does not run ({e}); install gcc") from None
    return (out.stdout or out.stderr).strip()


def compile_shared(source: str, cmd: list[str]) -> bytes:
    """The shared library built from `source` with FLAGS (CompileError with the compiler's log
    when it fails); gcc reads the prelude precompiled (runtime/c_prelude_pch.py)."""
    global COMPILES
    COMPILES += 1
    with tempfile.TemporaryDirectory(prefix="strata-cc-") as d:
        src, out = Path(d, SOURCE_NAME), Path(d, "strata.so")
        src.write_text(on_prelude_header(source, cmd, FLAGS, compiler_identity(cmd)))
        try:
            res = subprocess.run([*cmd, *FLAGS, "-o", str(out), SOURCE_NAME, *LIBS], cwd=d,
                                 capture_output=True, text=True, check=False)
        except OSError as e:
            raise DeviceUnavailable(f"the C compiler {cmd[0]} does not run ({e}); install gcc") from None
        if res.returncode != 0 or not out.is_file():
            log = (res.stderr or res.stdout).strip()
            hint = ""
            if "omp" in log.lower():
                hint = " (OpenMP missing: install libgomp with gcc, or libomp-dev for clang)"
            raise CompileError(f"the C compiler {cmd[0]} rejected the generated C{hint}:\n"
                               f"{_tail(log)}")
        return out.read_bytes()


def _tail(log: str, lines: int = 40) -> str:
    parts = log.splitlines()
    return "\n".join(parts if len(parts) <= lines else ["...", *parts[-lines:]])
