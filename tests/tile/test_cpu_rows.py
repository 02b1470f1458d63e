"""The CPU row schedule's reuse: a softmax row computes exp once (tile/passes/cpu_keep_values.py),
a causal mask's scores are read unconditionally and then selected (cpu_rows), and attention's
softmax is one row kernel between the two matmuls (loop/fuse.py materializes the weights instead
of the row max and sum). Run natively and compared with float64 eager, at odd sizes, with masked
and fully masked rows, with KEEP pinned both ways."""
import io
import re

import pytest
import torch
import torch.nn.functional as F

import strata
from conftest import HAS_CC
from strata.bench import check
from strata.core.context import Context
from strata.loop.ir import Load
from strata.tile.ir import walk

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


def cpu_compile(fn, inputs, knobs=None):
    log = io.StringIO()
    ctx = Context(knobs=knobs or {}, verbosity=2, stream=log)
    return strata.compile(fn, inputs, device="cpu", ctx=ctx), log.getvalue()


def assert_matches(prog, fn, inputs):
    for res in check.verify(prog, fn, inputs, True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"


def kernel_source(prog, name: str) -> str:
    c = prog.lowered.source
    start = c.index(f"{name}(")
    return c[start:c.index("\n}\n", start)]


@pytest.mark.parametrize("knobs,exps", [({}, 1), ({"KEEP": 0}, 2)], ids=str)
@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 1), (1, 2), (4, 1000)], ids=str)
def test_softmax_computes_exp_once_unless_told(shape, knobs, exps):
    x = torch.randn(shape) * 4
    x[0, ..., 0] = -float("inf")            # a masked entry: exp gives 0
    prog, log = cpu_compile(lambda t: torch.softmax(t, -1), (x,), knobs)
    if shape[-1] > 1:                       # (a row of one is 1 or NaN: nothing to keep)
        (k,) = prog.lowered.tile.kernels
        assert dict(k.knobs)["KEEP"] is (exps == 1)
        assert ("cpu_keep_values:" in log) is (exps == 1)
        assert kernel_source(prog, k.name).count("expf(") == exps
    assert_matches(prog, lambda t: torch.softmax(t, -1), (x,))


def test_a_fully_masked_row_gives_nan_as_eager():
    x = torch.randn(3, 8)
    x[1] = -float("inf")
    prog, _ = cpu_compile(lambda t: torch.softmax(t, -1), (x,))
    got, want = prog(x), torch.softmax(x, -1)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got[1]).all()
    torch.testing.assert_close(got[[0, 2]], want[[0, 2]])


def test_a_value_read_from_the_running_accumulator_is_not_kept():
    """x - running max is not the final x - max: nothing may be kept from the max loop."""
    def f(t):
        return torch.exp(t - t.amax(-1, keepdim=True)) + torch.exp(t).sum(-1, keepdim=True)
    x = torch.randn(5, 33)
    prog, _ = cpu_compile(f, (x,))
    assert_matches(prog, f, (x,))


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("heads,kv,seq,dim", [(4, 2, 37, 8), (2, 2, 1, 16), (3, 1, 64, 5)], ids=str)
def test_attention_softmax_is_one_row_kernel_between_the_matmuls(heads, kv, seq, dim):
    """FLASH=0: the matmul and softmax kernels a prompt of 64 tokens or more runs as one flash
    kernel by default (tests/attention/test_cpu_flash.py)."""
    inputs = (torch.randn(1, heads, seq, dim), torch.randn(1, kv, seq, dim), torch.randn(1, kv, seq, dim))
    prog, log = cpu_compile(causal, inputs, {"FLASH": 0})
    names = [k.name for k in prog.lowered.tile.kernels]
    if seq > 1:
        assert "materialized scaled_dot_product_attention_weights instead of " \
               "scaled_dot_product_attention_max" in log
        assert not any(n.endswith(("_max_reduce", "_sum_reduce")) for n in names), names
        weights = next(n for n in names if "weights" in n)
        src = kernel_source(prog, weights)
        assert src.count("expf(") == 1 and not re.search(r"if \(a\d+ <= a\d+\)", src), src
    assert_matches(prog, causal, inputs)


def test_a_gathered_load_keeps_its_mask():
    """An index read from data may be out of range where the mask drops it: still predicated."""
    def f(x, idx, keep):
        return torch.where(keep, x[idx], 0.0)
    x, idx = torch.randn(10), torch.tensor([1, 99, 3, -50])
    keep = torch.tensor([True, False, True, False])
    prog, _ = cpu_compile(f, (x, idx.clamp(0, 9), keep))
    (k,) = prog.lowered.tile.kernels
    assert [s.pred is not None for s in walk(k.body) if isinstance(s, Load) and s.buf == "x"] == [True]
    torch.testing.assert_close(prog(x, idx, keep), torch.tensor([x[1], 0.0, x[3], 0.0]))


def test_a_value_whose_input_the_row_overwrites_is_computed_again():
    """An in-place update between the loops: the output loop must read the new values."""
    def f(x):
        e = torch.exp(x).sum(-1, keepdim=True)
        x.mul_(2)
        return torch.exp(x) / e
    x = torch.randn(4, 19)
    prog, _ = cpu_compile(f, (x.clone(),))
    torch.testing.assert_close(prog(x.clone()), f(x.clone()))
