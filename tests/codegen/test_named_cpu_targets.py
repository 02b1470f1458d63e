"""Named CPU targets (targets.py) and `--ir asm` (runtime/disasm.py): each CPU's hot loop holds
its own instructions, checked here whatever CPU runs the test: AMX tiles for cpu-spr, vdpbf16ps on
zmm for cpu-znver4, ymm FMAs and no zmm for cpu-avx2, SVE/NEON FMAs for cpu-neoverse (through
Debian's cross gcc; skipped where it is not installed)."""
import re
import shutil

import pytest
import torch

import strata
from strata.api import compile_snippet
from strata.cli import main
from strata.core.context import Context
from strata.core.errors import DeviceUnavailable, StrataError
from strata.runtime.disasm import functions

BF16_MM = ("torch.randn(128, 256, dtype=torch.bfloat16) @ torch.randn(256, 512, "
           "dtype=torch.bfloat16)")
F32_MM = "torch.randn(96, 200) @ torch.randn(200, 136)"
NO_CROSS_GCC = shutil.which("aarch64-linux-gnu-gcc") is None


def kernel_asm(code: str, target: str) -> str:
    """The disassembly of the program's kernel functions (not the entry point)."""
    program, _ = compile_snippet(code, Context(target=target), until="asm")
    asm = program.ir("asm")
    assert asm.startswith(f"// {target} (")
    kernels = {n: text for n, text in functions(asm).items() if n.startswith("k_")}
    assert kernels, asm[:2000]
    return "\n".join(kernels.values())


@pytest.mark.parametrize("target, code, present, absent", [
    ("cpu-spr", BF16_MM, [r"\bldtilecfg\b", r"\btdpbf16ps\b"], []),
    ("cpu-znver4", BF16_MM, [r"\bvdpbf16ps\s+%zmm"], [r"\btdpbf16ps\b"]),
    ("cpu-avx2", BF16_MM, [r"\bvfmadd\w+ps\s+.*%ymm"], [r"%zmm", r"\bvdpbf16ps\b"]),
    ("cpu-spr", F32_MM, [r"\bvfmadd\w+ps\s+.*%zmm"], [r"\btdpbf16ps\b"]),
    ("cpu-avx2", F32_MM, [r"\bvfmadd\w+ps\s+.*%ymm"], [r"%zmm"]),
    pytest.param("cpu-neoverse", F32_MM, [r"\bfmla\b"], [r"%[xy]mm"], marks=pytest.mark.skipif(
        NO_CROSS_GCC, reason="aarch64-linux-gnu-gcc is not installed "
                             "(apt-get install gcc-aarch64-linux-gnu)")),
    pytest.param("cpu-rvv", F32_MM, [r"\b(fmadd\.s|vfmacc\.v\w)\b"], [r"%[xy]mm"],
                 marks=pytest.mark.skipif(shutil.which("riscv64-linux-gnu-gcc") is None, reason=(
                     "riscv64-linux-gnu-gcc is not installed (apt-get install "
                     "gcc-riscv64-linux-gnu)"))),     # (gcc 12 does not vectorise for RVV)
])
def test_the_hot_loop_has_the_targets_instructions(target, code, present, absent):
    asm = kernel_asm(code, target)
    for pattern in present:
        assert re.search(pattern, asm), f"{target}: no {pattern} in its kernels"
    for pattern in absent:
        assert not re.search(pattern, asm), f"{target}: {pattern} in its kernels"


def test_asm_from_the_command_line(capsys):
    assert main(["compile", "-c", F32_MM, "--target", "cpu-avx2", "--ir", "asm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("// cpu-avx2 (-march=x86-64-v3") and "<k_" in out


def test_asm_of_a_gpu_target_is_one_sentence(capsys):
    assert main(["compile", "-c", F32_MM, "--target", "sm_90", "--ir", "asm"]) == 1
    err = capsys.readouterr().err.strip()
    assert "--ir asm disassembles the C of a CPU target" in err and len(err.splitlines()) == 1


def test_code_for_another_cpu_without_qemu_is_one_sentence(monkeypatch):
    from strata.runtime import qemu
    monkeypatch.setattr(qemu.shutil, "which", lambda name: None)
    with pytest.raises(DeviceUnavailable, match="needs qemu-aarch64, which is not installed"):
        strata.compile(lambda x: x * 2, (torch.randn(8),), ctx=Context(target="cpu-neoverse"))


def test_running_a_target_whose_features_are_missing_is_refused(monkeypatch):
    import strata.api as api
    from strata.core.targets import TARGETS
    monkeypatch.setattr(api, "get_target", lambda name: TARGETS["cpu-avx2"] if name == "host"
                        else TARGETS[name])
    x = torch.randn(8)
    program = strata.compile(lambda x: x * 2, (x,), ctx=Context(target="cpu-spr"))
    assert "strata_run" in program.source()     # its code prints on any machine (the replay's)
    with pytest.raises(StrataError, match="needs amx_bf16, amx_int8, amx_tile, avx512_bf16"):
        program(x)
