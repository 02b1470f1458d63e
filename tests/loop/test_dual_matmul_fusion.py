"""A Llama MLP's act(x @ wg) * (x @ wu) is one kernel (loop/fuse.py): when a reduction cannot be
inlined into an enclosing one (down_proj), the elementwise node the enclosing reduction reads is
materialized instead, so gate and up are two reduce loops of one row kernel that writes the
product once, and down_proj loads a plain tensor (cp.async, wgmma). Checked against eager."""
import pytest
import torch
import torch.nn.functional as F

import strata
from conftest import run_and_compare
from strata.bench import check
from strata.core.context import Context
from strata.loop.ir import Let, Load, Loop, walk

r = torch.randn
BF16 = torch.bfloat16


def mlp(x, wg, wu, wd):
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def _reduce_loops(k) -> int:
    return sum(isinstance(s, Loop) and s.kind == "reduce" for s in walk(k.body))


def _ops(k) -> set[str]:
    return {s.value.op for s in walk(k.body) if isinstance(s, Let) and hasattr(s.value, "op")}


def _two_kernels(prog):
    """gate/up: one kernel with two reduce loops writing one tensor; down_proj reads that tensor
    as a plain load (no SiLU recomputed in its operand)."""
    lp = prog.lowered.loop
    assert len(lp.kernels) == 2, str(lp)
    both, down = lp.kernels
    assert _reduce_loops(both) == 2 and len(both.writes) == 1 and "sigmoid" in _ops(both), str(both)
    assert _reduce_loops(down) == 1 and _ops(down) == {"multiply"}, str(down)   # x * w, no prologue
    (product,) = both.writes
    assert any(isinstance(s, Load) and s.buf == product for s in walk(down.body)), str(down)
    return both, down


@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=str)
@pytest.mark.parametrize("b,s,h,i", [(1, 7, 33, 19), (2, 5, 40, 24), (1, 1, 17, 33)], ids=str)
def test_mlp_is_gate_up_kernel_then_down_proj(b, s, h, i, dtype):
    ctx = Context()
    inputs = tuple(t.to(dtype) for t in (r(b, s, h), r(i, h) / h ** 0.5, r(i, h) / h ** 0.5,
                                         r(h, i) / i ** 0.5))
    prog = run_and_compare(mlp, inputs, contraction=True, ctx=ctx)
    _two_kernels(prog)
    assert any(m.startswith("fuse: materialized mul instead of linear_red") for m in ctx.messages), \
        ctx.messages


def test_down_proj_operand_is_a_plain_copy():
    """At aligned shapes every operand of both contractions is filled by cp.async (sm_80+) or TMA
    feeding wgmma (sm_90a): none computes a prologue."""
    inputs = (r(1, 16, 64).to(BF16), r(48, 64).to(BF16), r(48, 64).to(BF16), r(32, 48).to(BF16))
    prog = run_and_compare(mlp, inputs, contraction=True)
    _two_kernels(prog)
    kernels = [k for k in prog.lowered.tile.kernels if k.mode == "mma"]
    assert len(kernels) == 2, prog.ir("tile")
    assert str(kernels[0]).count("fill=cp.async") == 4 and str(kernels[1]).count("fill=cp.async") == 2
    prog = strata.compile(mlp, inputs, ctx=Context(target="sm_90a"))
    text = prog.ir("tile")
    assert [k.mode for k in prog.lowered.tile.kernels] == ["wgmma", "wgmma"], text
    assert text.count("fill=tma") == 6
    for name, g, want in zip(prog.lowered.kernel.outputs, prog.run_numpy(inputs),
                             check.eager_reference(mlp, inputs)):
        res = check.compare(name, "bf16", g, want, check.tolerance("bf16", True))
        assert res.passed, f"{name}: rel err {res.rel:.3g}"


@pytest.mark.parametrize("combine", [lambda a, b: F.gelu(a) * b, lambda a, b: torch.relu(a) + b],
                         ids=["gelu_mul", "relu_add"])
def test_rule_is_not_specific_to_silu(combine):
    fn = lambda x, w1, w2, w3: combine(x @ w1, x @ w2) @ w3  # noqa: E731
    prog = run_and_compare(fn, (r(7, 33), r(33, 19), r(33, 19), r(19, 9)), contraction=True)
    assert [_reduce_loops(k) for k in prog.lowered.loop.kernels] == [2, 1], prog.ir("loop")


def test_a_reduction_read_elsewhere_is_not_recomputed():
    """h is also added to the output: materializing silu(h) would leave h to be recomputed in the
    last kernel, so h itself is materialized and no kernel computes x @ w1 twice."""
    def fn(x, w1, w2):
        h = x @ w1
        return F.silu(h) @ w2 + h
    ctx = Context()
    prog = run_and_compare(fn, (r(7, 33), r(33, 19), r(19, 19)), contraction=True, ctx=ctx)
    assert [_reduce_loops(k) for k in prog.lowered.loop.kernels] == [1, 1], prog.ir("loop")
    assert not any("instead of" in m for m in ctx.messages)


def test_residual_add_is_materialized_with_the_projection():
    """o_proj then RMSNorm then a projection: the residual add h + x @ wo, read by the norm, the
    next projection and the final residual, is what gets a buffer, not x @ wo alone."""
    def fn(h, x, wo, w, g):
        res = h + x @ wo
        y = res * torch.rsqrt(res.pow(2).mean(-1, keepdim=True) + 1e-6) * g
        return res + y @ w
    ctx = Context()
    prog = run_and_compare(fn, (r(7, 24), r(7, 33), r(33, 24), r(24, 24), r(24)), contraction=True,
                           ctx=ctx)
    assert [_reduce_loops(k) for k in prog.lowered.loop.kernels] == [1, 1, 1], prog.ir("loop")
    assert any("fuse: materialized add instead of" in m for m in ctx.messages), ctx.messages
