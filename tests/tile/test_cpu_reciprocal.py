"""cpu_reciprocal: a CPU row that divides by an earlier loop's float sum multiplies by its
reciprocal; softmax and a mean-normalised row against float64 eager, odd and size-1 rows, and
a division by something else (a loaded value) left as it is."""
import pytest
import torch

from conftest import HAS_CC
from test_cpu_dot import BF16, assert_matches, cpu_compile

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


@pytest.mark.parametrize("shape", [(2, 3, 37), (5, 1), (4, 128)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=str)
def test_softmax_and_a_sum_normalised_row_multiply_by_the_reciprocal(shape, dtype):
    x = torch.randn(*shape).to(dtype)
    for fn in (lambda x: torch.softmax(x, -1), lambda x: x / x.abs().sum(-1, keepdim=True)):
        prog, log = cpu_compile(fn, (x,))
        tile = str(prog.lowered.tile)
        if shape[-1] > 1:               # (a row of one element has no loop to divide in)
            assert "_inv = divide(1.0," in tile and "as multiplies by reciprocals" in log, tile
        assert_matches(prog, fn, (x,))


def test_a_division_by_a_load_stays_a_division():
    x, y = torch.randn(6, 40), torch.rand(6, 40) + 0.5
    prog, _ = cpu_compile(torch.div, (x, y))
    assert "_inv = divide(1.0," not in str(prog.lowered.tile)
    assert torch.equal(prog(x, y), x / y)
