"""cpu_split_guards: a CPU row loop whose loads are guarded by its index against constants runs
as one loop per interval, its guards decided; RoPE's rotate_half, pads of odd and size-1 rows,
a three-way concat and a non-contiguous input against eager, and guards it must not split."""
import pytest
import torch
import torch.nn.functional as F

from conftest import HAS_CC
from strata.core.context import Context
from strata.core.expr import Const, Var, call
from strata.loop.ir import Load, Loop, Store
from strata.tile.ir import Mode, walk
from strata.tile.passes.cpu_split_guards import _cuts, cpu_split_guards
from test_cpu_dot import BF16, assert_matches, cpu_compile

needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                 "here (install gcc)")


def rotate_half_rope(q, cos, sin):
    half = q.shape[-1] // 2
    return q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin


def guarded_loads(prog) -> list:
    return [s for k in prog.lowered.tile.kernels for s in walk(k.body)
            if isinstance(s, Load) and s.pred is not None]


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=str)
@pytest.mark.parametrize("d", [64, 6, 2], ids=lambda d: f"d{d}")
def test_rope_rotate_half_runs_as_two_plain_loops(dtype, d):
    q, cos, sin = (torch.randn(1, 3, 5, d).to(dtype) for _ in range(3))
    prog, log = cpu_compile(rotate_half_rope, (q, cos, sin))
    assert "splits the loop of" in log and f"at {d // 2}" in log, log
    assert not guarded_loads(prog), str(prog.lowered.tile)
    assert_matches(prog, rotate_half_rope, (q, cos, sin))


@needs_cc
@pytest.mark.parametrize("pad", [(2, 3), (0, 5), (1, 0), (3, 3, 1, 2)], ids=str)
@pytest.mark.parametrize("n", [1, 7, 131], ids=lambda n: f"n{n}")
def test_pads_match_eager(pad, n):
    x = torch.randn(2, 4, n).to(BF16)
    fn = lambda x: F.pad(x, pad) * 2     # noqa: E731
    prog, _ = cpu_compile(fn, (x,))
    # the last axis' guards are decided; a pad of rows keeps the row's guard (an outer index)
    assert all("a1" in str(s.pred) and "a2" not in str(s.pred) for s in guarded_loads(prog))
    assert_matches(prog, fn, (x,))


@needs_cc
def test_a_three_way_concat_of_a_transposed_input_matches_eager():
    x = torch.randn(9, 6).t()                           # non-contiguous
    fn = lambda x: torch.cat((x[:, 5:], x[:, :2] * 3, x[:, 2:5]), -1) + 1     # noqa: E731
    prog, log = cpu_compile(fn, (x,))
    assert "at 4, 6" in log and not guarded_loads(prog), log
    assert_matches(prog, fn, (x,))


def _loop(pred) -> Loop:
    body = (Load("v", "x", (Var("a2"),), "f32", pred), Store("y", (Var("a2"),), Var("v", "f32")))
    return Loop("a2", 10, "free", body)


def test_only_comparisons_with_constants_are_split():
    a2 = Var("a2")
    assert _cuts(_loop(call("lt", a2, Const(4)))) == [4]
    assert _cuts(_loop(call("logical_and", call("ge", call("add", a2, Const(3)), Const(5)),
                                      call("le", a2, Const(7))))) == [2, 8]
    assert _cuts(_loop(call("lt", call("mod", a2, Const(2)), Const(1)))) == []    # every other
    assert _cuts(_loop(call("lt", call("multiply", a2, Const(2)), Const(9)))) == []
    assert _cuts(_loop(call("lt", a2, Const(10)))) == []         # true all along: nothing to cut


def test_kernels_other_than_rows_are_left_alone():
    class Elementwise:
        mode = Mode.ELEMENTWISE
    k = Elementwise()
    assert cpu_split_guards(k, Context()) is k
