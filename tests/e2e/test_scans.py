"""Cumulative ops as blocked scans (tensor/rules_scan.py) against eager: long axes take the
blocked path (an axis over 64), short ones the triangle; NaN, inf, ints, bf16, empty and 0-d."""
import pytest
import torch

from tests.conftest import run_and_compare

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("fn, x", [
    pytest.param(lambda x: torch.cumsum(x, -1), torch.randn(2, 1000), id="cumsum-blocked"),
    pytest.param(lambda x: torch.cumsum(x, 0), torch.randn(97, 3), id="cumsum-prime-dim0"),
    pytest.param(lambda x: torch.cumsum(x, 1), torch.randn(3, 5, 4).transpose(0, 2), id="non-contiguous"),
    pytest.param(lambda x: torch.cumsum(x, 0), torch.randint(-5, 5, (101,)), id="cumsum-int"),
    pytest.param(lambda x: torch.cumsum(x, 0), torch.randn(130).bfloat16(), id="cumsum-bf16"),
    pytest.param(lambda x: torch.cumsum(x, 0), torch.randn(()), id="0-d"),
    pytest.param(lambda x: torch.cumsum(x, 1), torch.randn(3, 0), id="empty"),
    pytest.param(lambda x: torch.cumprod(x, 1), torch.rand(3, 77) + 0.5, id="cumprod-blocked"),
    pytest.param(lambda x: torch.cumprod(x, 0), torch.randn(7), id="cumprod"),
    pytest.param(lambda x: torch.cummax(x, 1), torch.randint(0, 4, (2, 90)).float(), id="cummax-ties"),
    pytest.param(lambda x: torch.cummin(x, 0), torch.tensor([3., 1., NAN, 0., NAN, -1.]), id="cummin-nan"),
    pytest.param(lambda x: torch.cummax(x, 0), torch.randperm(200), id="cummax-int"),
    pytest.param(lambda x: torch.logcumsumexp(x, 1), torch.randn(2, 300) * 30, id="logcumsumexp"),
    pytest.param(lambda x: torch.logcumsumexp(x, 0), torch.tensor([-INF, -1000., 0., INF, 2.]), id="lcse-inf"),
])
def test_scan(fn, x):
    run_and_compare(fn, (x,))


def test_top_p_mask_over_a_vocabulary():
    """The sampling use: the mass before each token of a sorted vocabulary-sized row."""
    def fn(logits):
        p = torch.softmax(logits, -1).sort(descending=True).values[..., :512]
        return torch.cumsum(p, -1) - p < 0.9
    run_and_compare(fn, (torch.randn(1, 512) * 3,))
