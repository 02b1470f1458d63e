"""Hopper contractions whose wgmmas run as a pipeline, checked in the machine code without a GPU
(issue 54 item 4).

Why: on the H100 the 4096^3 bf16 matmul ran at 0.46x cuBLAS, and ptxas said why: "C7514 ...
wgmma.mma_async instructions are serialized", each HGMMA waiting for the one before it
(WARPGROUP.DEPBAR after every one in the SASS), because a wgmma group stayed in flight across the
K loop's back edge and the next step's mbarrier wait is a loop. kernel_ir/lower_wgmma.py now runs
the K loop a pass of 2 or 4 steps at a time, a group in flight only within a pass. These tests
read NVRTC's ptxas log and `cuobjdump -sass` (runtime/sass.py): no C7514, no spills, a step's
HGMMAs chained (only the last of each group waits on its scoreboard), and a step's group still
in flight while the next step issues (WARPGROUP.DEPBAR.LE gsb0, 0x1) where the K loop has more
than one step a pass.
"""
import pytest
import torch

from conftest import skip_unless_sass_readable

skip_unless_sass_readable()

import strata  # noqa: E402
from strata.core.context import Context  # noqa: E402
from strata.runtime.nvrtc import ptxas_log, resource_usage  # noqa: E402
from strata.runtime.sass import sass  # noqa: E402

ARCH = "sm_90a"
BF16 = torch.bfloat16


CASES = {"4096^3": (4096, 4096, 4096, False), "3 K steps": (256, 192, 256, False),
         "prefill gate, SiLU": (128, 2048, 5632, True)}


@pytest.mark.parametrize("m,k,n,silu", CASES.values(), ids=CASES)
def test_wgmma_groups_are_chained_and_pipelined_not_serialized(m, k, n, silu):
    a, b = torch.randn(m, k, dtype=BF16), torch.randn(k, n, dtype=BF16)
    fn = (lambda a, b: torch.nn.functional.silu(a @ b)) if silu else (lambda a, b: a @ b)
    prog = strata.compile(fn, (a, b), device="sim", ctx=Context(target=ARCH))
    source = prog.source("cuda")
    kernels = [t for t in prog.lowered.tile.kernels if dict(t.knobs).get("INSTR") == "wgmma"]
    assert kernels, "no wgmma kernel: the test would check nothing"
    assert "C7514" not in ptxas_log(source, ARCH)
    for name, use in resource_usage(source, ARCH).items():
        assert use["spill_stores"] == use["spill_loads"] == 0, f"{name} spills: {use}"
    code = sass(source, ARCH)
    for t in kernels:
        knobs, lines = dict(t.knobs), code[t.name].splitlines()
        hgmma = [ln for ln in lines if "HGMMA" in ln]
        waits = [ln for ln in hgmma if "gsb0" in ln]
        assert len(hgmma) == len(waits) * (knobs["TILE_K"] // 16), \
            f"{t.name}: {len(waits)} of {len(hgmma)} HGMMAs wait on their scoreboard"
        steps = -(-k // knobs["TILE_K"])
        if steps % 2 == 0 and knobs["STAGES"] > 1:
            assert any("DEPBAR.LE gsb0, 0x1" in ln for ln in lines), f"{t.name}: no overlap"


@pytest.mark.parametrize("m,k,n", [(4096, 4096, 4096), (128, 2048, 5632)], ids=str)
def test_fp8_scaled_mm_runs_chained_qgmma(m, k, n):
    """torch._scaled_mm of e4m3 operands (row scales, bf16 out) on sm_90a: QGMMA 64xNx32 E4M3
    in the SASS, a step's four chained (one scoreboard wait), steps overlapping, no C7514, no
    spills."""
    e4m3 = torch.float8_e4m3fn
    inputs = (torch.randn(m, k).to(e4m3), torch.randn(n, k).to(e4m3), torch.rand(m, 1),
              torch.rand(1, n))

    def f(a, b, sa, sb):
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=BF16)
    prog = strata.compile(f, inputs, device="sim", ctx=Context(target=ARCH))
    source = prog.source("cuda")
    kernels = [t.name for t in prog.lowered.tile.kernels if t.mode == "wgmma"]
    assert kernels and "C7514" not in ptxas_log(source, ARCH)
    for name, use in resource_usage(source, ARCH).items():
        assert use["spill_stores"] == use["spill_loads"] == 0, f"{name} spills: {use}"
    code = sass(source, ARCH)
    for name in kernels:
        lines = code[name].splitlines()
        qgmma = [ln for ln in lines if "QGMMA.64x128x32.F32.E4M3.E4M3" in ln]
        assert qgmma and len(qgmma) == 4 * sum("gsb0" in ln for ln in qgmma)
        assert any("DEPBAR.LE gsb0, 0x1" in ln for ln in lines)


@pytest.mark.parametrize("quant,seq", [(None, 64), ("fp8", 128)], ids=["bf16", "fp8"])
def test_no_sm90a_kernel_of_a_decoder_layer_is_serialized_or_spills(quant, seq):
    """Every kernel of a TinyLlama bf16 decoder layer on sm_90a (wgmma projections, attention,
    norms), translation unit by unit: ptxas serializes no wgmma and spills nothing. With
    `--quant fp8` all seven projections run on QGMMA (e4m3 activations stored by a kernel of
    their own; none left on CUDA cores)."""
    from strata.api import compile_model
    from strata.codegen.cuda_units import plan_units
    program, _ = compile_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0", layer=0, seq_len=seq,
                               dtype="bf16", ctx=Context(target=ARCH), quant=quant)
    units = plan_units(program.lowered.kernel, ARCH).sources
    assert any("wgmma.mma_async" in source for source in units)
    for source in units:
        assert "C7514" not in ptxas_log(source, ARCH)
        for name, use in resource_usage(source, ARCH).items():
            assert use["spill_stores"] == use["spill_loads"] == 0, f"{name} spills: {use}"
    if quant:
        assert not [k.name for k in program.lowered.tile.kernels if k.mode in ("matmul", "mma")]
        assert sum(t.count("QGMMA") for s in units for t in sass(s, ARCH).values()) > 0
