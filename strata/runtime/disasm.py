"""The machine code of the C target for any named CPU, on this machine: `--ir asm`.

Why: speed must not hinge on what gcc's vectoriser guessed, and a schedule for a CPU we are not
running on (an AMX Xeon from an EPYC, an ARM server from x86) still has to be checked. The C
source is compiled to an object with the flags of a native build but the target's own `-march`
(`-mcpu` on aarch64, through Debian's cross gcc), and objdump prints it: a test can then look
for zmm FMAs, vdpbf16ps or AMX tile ops in the hot loop of a CPU it does not have. Each kernel's
hot loop is summed up first, with llvm-mca's cycles for that CPU (runtime/mca.py).
"""
from __future__ import annotations

import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..core.errors import CompileError, DeviceUnavailable
from . import cc
from .mca import hot_loop, summary

_CROSS = {"aarch64": "aarch64-linux-gnu-", "riscv64": "riscv64-linux-gnu-", "x86_64": "x86_64-linux-gnu-"}
_APT = {"aarch64": "gcc-aarch64-linux-gnu", "riscv64": "gcc-riscv64-linux-gnu",
        "x86_64": "gcc-x86-64-linux-gnu"}


def tools(machine: str) -> tuple[list[str], str]:
    """(the C compiler, objdump) that build for `machine`: this machine's own, else the cross
    ones Debian installs as <triple>-gcc and <triple>-objdump."""
    if machine in ("", platform.machine()):
        return cc.find_compiler(), shutil.which("objdump") or "objdump"
    prefix = _CROSS.get(machine)
    gcc = shutil.which(f"{prefix}gcc") if prefix else None
    if gcc is None:
        raise DeviceUnavailable(f"code for {machine} needs a cross compiler, {prefix or machine}gcc,"
                                f" which is not installed (apt-get install {_APT.get(machine, 'gcc')})")
    return [gcc], shutil.which(f"{prefix}objdump") or "objdump"


# gcc's switch for each x86 feature a Target names (an -march may predate some: gcc 12's znver3)
_X86_FLAGS = {"avx": "-mavx", "avx2": "-mavx2", "fma": "-mfma", "f16c": "-mf16c",
              "avx512f": "-mavx512f", "avx512bw": "-mavx512bw", "avx512vl": "-mavx512vl",
              "avx512_bf16": "-mavx512bf16", "avx512_vnni": "-mavx512vnni", "avx_vnni": "-mavxvnni",
              "amx_tile": "-mamx-tile", "amx_bf16": "-mamx-bf16", "amx_int8": "-mamx-int8"}


def arch_flags(target) -> list[str]:
    """-march=native for the host; -mcpu on aarch64; -march and the ABI on RISC-V; else -march
    and a switch per x86 feature."""
    if target.isa == "native":
        return ["-march=native", *cc.vector_flags(cc.cpu_features())]
    if target.machine == "aarch64":
        return [f"-mcpu={target.isa}"]
    if target.machine == "riscv64":
        return [f"-march={target.isa}", "-mabi=lp64d"]
    return [f"-march={target.isa}", *sorted(_X86_FLAGS[f] for f in target.features if f in _X86_FLAGS),
            *cc.vector_flags(" ".join(target.features))]


def build_flags(target) -> list[str]:
    """A native build's flags (runtime/cc.py) for `target`: its own -march or -mcpu, no shared
    library, and glibc's x86 vector math only on x86."""
    flags = [f for f in cc.FLAGS if not f.startswith(("-march", "-mprefer-vector-width"))
             and f not in ("-shared", "-fPIC")]
    if target.machine not in ("", "x86_64"):
        flags = [f for f in flags if f != "-DSTRATA_LIBMVEC"]
    return flags + arch_flags(target)


def build(target, sources: dict[str, str], output: str, args=(), libs=(), timeout_s: float = 600
          ) -> bytes:
    """`output` built from `sources` (file name -> C) by the target's compiler with
    build_flags(target) and `args` (`libs` after the sources); CompileError with its log
    (subprocess.TimeoutExpired after `timeout_s`)."""
    compiler, _ = tools(target.machine)
    with tempfile.TemporaryDirectory(prefix="strata-cross-") as d:
        for name, text in sources.items():
            Path(d, name).write_text(text)
        res = subprocess.run([*compiler, *build_flags(target), *args, "-o", output, *sources, *libs],
                             cwd=d, capture_output=True, text=True, timeout=timeout_s)
        if res.returncode != 0:
            raise CompileError(f"{compiler[0]} rejected the generated C for {target}:\n"
                               f"{(res.stderr or res.stdout).strip()[-4000:]}")
        return Path(d, output).read_bytes()


def object_code(source: str, target, timeout_s: float = 600) -> bytes:
    """The object file of `source` built for `target`."""
    return build(target, {cc.SOURCE_NAME: source}, "strata.o", args=("-c",), timeout_s=timeout_s)


def disassemble(source: str, target) -> str:
    """objdump -d of `source` built for `target`: one `<function>:` block per C function,
    headed by each kernel's hot loop summed up."""
    body = _objdump(source, target)
    loops = [summary(n, hot_loop(text), target) for n, text in functions(body).items()
             if n.startswith("k_")]
    return "\n".join([f"// {target} ({' '.join(arch_flags(target))})", *loops, body.strip()])


def disassemble_functions(source: str, target, timeout_s: float = 600) -> dict[str, str]:
    """The disassembly of each C function of `source` built for `target`, by name."""
    return functions(_objdump(source, target, timeout_s))


def _objdump(source: str, target, timeout_s: float = 600) -> str:
    _, objdump = tools(target.machine)
    with tempfile.TemporaryDirectory(prefix="strata-asm-") as d:
        Path(d, "strata.o").write_bytes(object_code(source, target, timeout_s))
        res = subprocess.run([objdump, "-dr", "--no-show-raw-insn", "strata.o"], cwd=d,
                             capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise CompileError(f"{objdump} could not disassemble the object: {res.stderr.strip()}")
    return res.stdout.split("\n\n", 2)[-1]           # past the file-format header


def functions(asm: str) -> dict[str, str]:
    """The disassembly of each function, by name (`<name>:` headers)."""
    out, name = {}, None
    for line in asm.splitlines():
        if line.endswith(">:") and "<" in line and "<.L" not in line:   # (RISC-V prints labels)
            name = line[line.index("<") + 1:-2]
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out
