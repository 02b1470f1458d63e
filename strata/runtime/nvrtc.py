"""CUDA C -> cubin/PTX with NVRTC (cuda-bindings), no GPU needed.

cuda.bindings is imported inside the functions so that strata imports on any machine. Options:
  --gpu-architecture=sm_XX   real architecture (sm_80, sm_90, sm_90a ...), so a cubin can be had
  --std=c++17                 what the emitted code and the CUDA headers are written against
  -I<dirs>                    cuda_fp16.h / cuda_bf16.h and what they include (see include_dirs)
  -lineinfo                   source lines in the cubin, for profilers; it does not change the code
No fast-math: expf, division and sqrt keep IEEE accuracy so that results match the simulator.
Nothing is cached here; a persistent cache sits above this module.
"""
from __future__ import annotations

import logging
import os
import re
import time
from functools import lru_cache
from pathlib import Path

from ..core.errors import CompileError

log = logging.getLogger("strata.nvrtc")

COMPILES = 0    # real NVRTC compiles in this process (the kernel cache tests count them)

_KERNEL_RE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(")


@lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """Directories holding cuda_fp16.h and friends: $CUDA_HOME/$CUDA_PATH, /usr/local/cuda, then
    the headers pip wheels ship (found by cuda.pathfinder)."""
    found: list[str] = []

    real: set[str] = set()

    def add(d) -> None:
        if d and Path(d, "cuda_fp16.h").is_file() and os.path.realpath(d) not in real:
            real.add(os.path.realpath(d))
            found.append(str(d))

    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            add(Path(os.environ[env], "include"))
    add("/usr/local/cuda/include")
    try:
        from cuda import pathfinder
        for lib in ("cudart", "nvrtc"):
            try:
                loc = pathfinder.locate_nvidia_header_directory(lib)
                add(loc.abs_path if loc is not None else None)
            except Exception:        # not installed in this flavour: try the next one
                pass
    except ImportError:
        pass
    return tuple(found)


def kernel_names_in(source: str) -> list[str]:
    """Names of the __global__ functions in `source` (for error messages)."""
    return _KERNEL_RE.findall(source)


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def options(arch: str = "sm_90") -> list[str]:
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise CompileError(f"unknown GPU architecture {arch!r} (expected e.g. sm_80, sm_90a)")
    return [f"--gpu-architecture={arch}", "--std=c++17", "-lineinfo",
            *(f"-I{d}" for d in include_dirs())]


def compile_cuda(source: str, arch: str = "sm_90", kernel_names=(), want: str = "cubin") -> bytes:
    """Compile one translation unit; return the cubin (or PTX text as bytes, want="ptx").

    Raises CompileError naming the kernel(s) and carrying the NVRTC log."""
    return compile_cuda_timed(source, arch, kernel_names, want)[0]


def compile_cuda_timed(source: str, arch: str = "sm_90", kernel_names=(),
                       want: str = "cubin") -> tuple[bytes, float]:
    """compile_cuda, also returning the seconds NVRTC took."""
    image, seconds, _ = _compile(source, arch, kernel_names, want)
    return image, seconds


_PTXAS_FN = re.compile(r"Function properties for (\w+)\s*\n[^\n]*?(\d+) bytes spill stores, (\d+) "
                       r"bytes spill loads\s*\n[^\n]*?Used (\d+) registers(?:[^\n]*?(\d+) bytes smem)?")


def ptxas_log(source: str, arch: str = "sm_90") -> str:
    """ptxas -v's text for the source's kernels (its warnings too: C7514, a serialized wgmma)."""
    return _compile(source, arch, (), "cubin", ("--ptxas-options=-v",))[2]


def resource_usage(source: str, arch: str = "sm_90") -> dict[str, dict]:
    """What ptxas says of each kernel: {name: {registers, spill_stores, spill_loads, smem}}
    (registers per thread, spill bytes per thread, static shared memory bytes per block)."""
    return {m[1]: dict(registers=int(m[4]), spill_stores=int(m[2]), spill_loads=int(m[3]),
                       smem=int(m[5] or 0)) for m in _PTXAS_FN.finditer(ptxas_log(source, arch))}


def _compile(source: str, arch: str, kernel_names, want: str, extra=()) -> tuple[bytes, float, str]:
    global COMPILES
    from cuda.bindings import nvrtc
    if want not in ("cubin", "ptx"):
        raise ValueError(f"want must be 'cubin' or 'ptx', not {want!r}")
    names = list(kernel_names) or kernel_names_in(source)
    label = ", ".join(names) or "<no kernels>"
    unit = f"strata_{names[0] if names else 'program'}.cu"
    opts = options(arch) + list(extra)
    t0 = time.perf_counter()
    COMPILES += 1
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), unit.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        text = _log(nvrtc, prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC failed to compile kernel(s) {label} for {arch} "
                               f"({_name(err)}):\n{text.rstrip()}\n{_context(source, text)}".rstrip())
        if want == "cubin":
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            _check(err, "nvrtcGetCUBINSize")
            image = bytearray(size)   # never bytes: NVRTC writes into it
            (err,) = nvrtc.nvrtcGetCUBIN(prog, image)
            _check(err, "nvrtcGetCUBIN")
            image = bytes(image)
        else:
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            _check(err, "nvrtcGetPTXSize")
            image = bytearray(size)   # never bytes: NVRTC writes into it
            (err,) = nvrtc.nvrtcGetPTX(prog, image)
            _check(err, "nvrtcGetPTX")
            image = bytes(image).rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    seconds = time.perf_counter() - t0
    log.debug("nvrtc %s for %s: %.1f ms, %d bytes%s", label, arch, seconds * 1e3, len(image),
              f"\n{text}" if text.strip() else "")
    return image, seconds, text


def _log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(err, "nvrtcGetProgramLogSize")
    buf = bytearray(size)   # never bytes: NVRTC writes into it
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    _check(err, "nvrtcGetProgramLog")
    return buf.rstrip(b"\0").decode(errors="replace")


def _context(source: str, log_text: str) -> str:
    """The source line of the first error, so that the message stands on its own."""
    m = re.search(r"\((\d+)\): (?:catastrophic )?error", log_text)
    if not m:
        return ""
    lines = source.splitlines()
    n = int(m.group(1))
    return f"line {n}: {lines[n - 1].strip()}" if 0 < n <= len(lines) else ""


def _name(err) -> str:
    return getattr(err, "name", str(err))


def _check(err, what: str) -> None:
    from cuda.bindings import nvrtc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {_name(err)}")
