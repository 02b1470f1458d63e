"""materialize_prologue: on sm_90a a 16-bit contraction whose operand has a computed prologue
(RMSNorm's normed x, SiLU(gate) * up) becomes an elementwise kernel writing that operand to a
bf16 temp and a wgmma kernel reading it by TMA. Through the simulator against eager float64,
the PTX built by NVRTC for sm_90a, the heuristic and the PROLOGUE knob both ways, and sm_80 /
sm_90 unchanged."""
import io

import pytest
import torch
import torch.nn.functional as F

import strata
from strata import pipeline
from strata.core.context import Context

from test_wgmma_schedule import _check, nvrtc
from strata.kernel_ir.verify import verify_program

r = torch.randn
BF16, SM90A = torch.bfloat16, "sm_90a"


def rms_linear(x, g, w):
    """HF's LlamaRMSNorm then a projection: statistics in f32, the normed x back in bf16."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
    return F.linear(g * h.to(x.dtype), w)


def swiglu_down(g, u, w):
    return F.linear(F.silu(g) * u, w)


def gate_up(a, b, wg, wu):
    h = a * b
    return F.silu(F.linear(h, wg)) * F.linear(h, wu)


def _bf16(*shapes):
    return tuple(r(*s).to(BF16) for s in shapes)


def _compile(fn, inputs, knobs=None, target=SM90A, until="cuda", verbosity=0):
    ctx = Context(target=target, knobs=knobs or {}, verbosity=verbosity, stream=io.StringIO())
    return strata.compile(fn, inputs, ctx=ctx, until=until), ctx


def _contraction_modes(prog):
    """Modes of the kernels made from the linear (the RMSNorm statistics kernel left out)."""
    return [k.mode for k in prog.lowered.tile.kernels if k.name.startswith("k_linear")]


CASES = [
    ("rms_9x64x40", rms_linear, ((1, 9, 64), (64,), (40, 64))),
    ("rms_70x136x72", rms_linear, ((2, 35, 136), (136,), (72, 136))),
    ("swiglu_9x48x33", swiglu_down, ((9, 48), (9, 48), (33, 48))),
    ("swiglu_70x200x24", swiglu_down, ((70, 200), (70, 200), (24, 200))),
]


@pytest.mark.parametrize("name,fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_pinned_materialize_runs_on_wgmma(name, fn, shapes):
    inputs = _bf16(*shapes)
    prog, ctx = _compile(fn, inputs, {"PROLOGUE": "materialize"})
    assert _contraction_modes(prog) == ["elementwise", "wgmma"], prog.ir("tile")
    pro, mm = [k for k in prog.lowered.tile.kernels if k.name.startswith("k_linear")]
    assert pro.name == "k_linear_reduce_prologue" and pro.writes == ("k_linear_reduce_operand",)
    assert "k_linear_reduce_operand" in mm.reads and dict(mm.knobs)["PROLOGUE"] == "materialize"
    assert prog.lowered.kernel.buffer("k_linear_reduce_operand").dtype == "bf16"
    assert any("computed once into k_linear_reduce_operand" in m for m in ctx.messages)
    verify_program(prog.lowered.kernel)
    ptx = nvrtc.compile_cuda(prog.source("cuda"), SM90A, want="ptx").decode()
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    _check(prog, fn, inputs)


def test_gate_and_up_share_one_materialized_operand():
    inputs = _bf16((9, 40), (9, 40), (24, 40), (24, 40))
    prog, _ = _compile(gate_up, inputs, {"PROLOGUE": "materialize"})
    assert [k.mode for k in prog.lowered.tile.kernels] == ["elementwise", "wgmma"], prog.ir("tile")
    pro, mm = prog.lowered.tile.kernels
    assert len([s for s in mm.body if type(s).__name__ == "MmaLoop"]) == 2
    assert mm.reads[0] == pro.writes[0] and pro.writes[0] not in mm.reads[1:]
    _check(prog, gate_up, inputs)


def test_default_materializes_activations_against_a_big_weight():
    inputs = _bf16((1, 128, 512), (512,), (1024, 512))
    prog, _ = _compile(rms_linear, inputs, until="tile")      # split_matmul_k splits K first
    assert _contraction_modes(prog) == ["elementwise", "wgmma", "rows"], prog.ir("tile")
    assert "PROLOGUE=materialize" in prog.ir("tile")
    prog, ctx = _compile(rms_linear, inputs, {"PROLOGUE": "fuse"}, until="tile")
    assert _contraction_modes(prog) == ["mma", "rows"], prog.ir("tile")
    assert "PROLOGUE=fuse" in prog.ir("tile")
    assert any(m.startswith("materialize_prologue: k_linear_reduce") and
               "declined, PROLOGUE=fuse pinned" in m for m in ctx.messages), ctx.messages


@pytest.mark.parametrize("fn,shapes,why", [
    (rms_linear, ((1, 9, 64), (64,), (40, 64)), "too small to want wgmma"),
    (swiglu_down, ((128, 1024), (128, 1024), (128, 1024)), "is not small next to"),
], ids=["small", "operand_as_big_as_weight"])
def test_default_fuses_when_materializing_does_not_pay(fn, shapes, why):
    prog, ctx = _compile(fn, _bf16(*shapes), {"SPLIT_K": "1"}, until="tile")
    assert _contraction_modes(prog) == ["mma"], prog.ir("tile")
    assert any(m.startswith("materialize_prologue:") and why in m for m in ctx.messages), ctx.messages


@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
def test_other_targets_keep_one_mma_kernel(target):
    inputs = _bf16((1, 128, 512), (512,), (1024, 512))
    for knobs in ({}, {"PROLOGUE": "materialize"}):
        prog, ctx = _compile(rms_linear, inputs, knobs, target=target, until="tile")
        assert _contraction_modes(prog) == ["mma", "rows"], prog.ir("tile")
        assert "PROLOGUE" not in prog.ir("tile")
        assert any(f"target {target} has no wgmma" in m for m in ctx.messages
                   if m.startswith("materialize_prologue:"))


def test_declines_when_wgmma_would_refuse_the_other_operand():
    def x_at_w(g, u, w):                 # w stored (K, 33): rows of 66 bytes, TMA refuses it
        return (F.silu(g) * u) @ w
    prog, ctx = _compile(x_at_w, _bf16((70, 64), (70, 64), (64, 33)),
                         {"PROLOGUE": "materialize"}, until="tile")
    assert [k.mode for k in prog.lowered.tile.kernels] == ["mma"], prog.ir("tile")
    assert any("not a multiple of 16 bytes" in m and "would decline it anyway" in m for m in ctx.messages)


def test_bad_knob_is_refused():
    with pytest.raises(ValueError, match="PROLOGUE=both"):
        _compile(swiglu_down, _bf16((9, 48), (9, 48), (33, 48)), {"PROLOGUE": "both"}, until="tile")


def test_vv_diff_shows_the_pass():
    prog, ctx = _compile(swiglu_down, _bf16((9, 48), (9, 48), (33, 48)), {"PROLOGUE": "materialize"},
                         until="tile", verbosity=2)
    num = {n: i for i, (n, _) in enumerate(pipeline.TILE_PASSES, start=1)}
    assert num["materialize_prologue"] + 1 == num["wgmma_tile"]
    tag = f"t:{num['materialize_prologue']:03d}_materialize_prologue"
    diff = "\n".join(ctx.messages).split(f">>> {tag}")[1].split(f"<<< {tag}")[0]
    assert "+kernel k_linear_reduce_prologue  # PROLOGUE=materialize" in diff
    assert "+    k_linear_reduce_operand[a0, a2] = v2" in diff
    assert "+        v2 = load k_linear_reduce_operand[a0, a2]" in diff
