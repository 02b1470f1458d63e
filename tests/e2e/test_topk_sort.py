"""topk, sort and argsort against eager (values and indices): simulator and native CPU."""
import pytest
import torch

from tests.conftest import run_and_compare


@pytest.mark.parametrize("fn, x", [
    pytest.param(lambda x: torch.topk(x, 3), torch.randn(3, 10), id="topk"),
    pytest.param(lambda x: torch.topk(x, 2, dim=0, largest=False), torch.randn(3, 7), id="smallest-dim0"),
    pytest.param(lambda x: torch.topk(x, 1), torch.randn(1, 1), id="size-1"),
    pytest.param(lambda x: torch.topk(x, 5), torch.randn(2, 5), id="k-is-n"),
    pytest.param(lambda x: torch.topk(x, 2), torch.randperm(13).reshape(1, 13), id="int64"),
    pytest.param(lambda x: torch.topk(x.softmax(-1), 2)[1], torch.randn(6, 8), id="moe-routing"),
    pytest.param(lambda x: torch.topk(x, 3), torch.tensor([[1.0, float("nan"), 3.0, 2.0, float("-inf")]]),
                 id="nan-first"),
    pytest.param(lambda x: torch.topk(x, 5, largest=False),
                 torch.tensor([[1.0, float("nan"), 3.0, float("inf"), -2.0]]), id="smallest-nan-last"),
    pytest.param(lambda x: torch.topk(x, 7)[0], torch.tensor([[2.0, float("-inf"), 1.0, float("-inf"),
                                                               float("-inf"), float("-inf"), 0.5]]),
                 id="neg-inf-winners"),
    pytest.param(lambda x: torch.topk(x, 50), torch.randn(2, 1009), id="top-50-of-prime-row"),
    pytest.param(lambda x: torch.sort(x), torch.randn(3, 11), id="sort"),
    pytest.param(lambda x: torch.sort(x, dim=0, descending=True), torch.randn(7, 3), id="sort-desc-dim0"),
    pytest.param(lambda x: torch.sort(x, stable=True), torch.randint(0, 3, (2, 9)), id="stable-ties"),
    pytest.param(lambda x: torch.sort(x, descending=True, stable=True), torch.randint(0, 3, (2, 9)),
                 id="stable-ties-desc"),
    pytest.param(lambda x: torch.sort(x), torch.tensor([1.0, float("nan"), -2.0, 3.0, float("nan")]),
                 id="nan-last"),
    pytest.param(lambda x: torch.argsort(x, dim=-1), torch.randn(4, 6), id="argsort"),
    pytest.param(lambda x: torch.sort(x), torch.randn(()), id="0-d"),
])
def test_topk_sort(fn, x):
    torch.manual_seed(0)
    run_and_compare(fn, (x,))


def test_topk_ties_give_distinct_indices_of_equal_values():
    """torch leaves the order of ties open; strata's is by index, and never repeats one (the
    -inf and NaN winners included)."""
    import strata
    x = torch.tensor([[3.0, float("nan"), 3.0, float("-inf"), 3.0, float("nan"), float("-inf")]])
    vals, idx = strata.compile(lambda x: torch.topk(x, 7), (x,), device="sim")(x)
    assert idx.tolist() == [[1, 5, 0, 2, 4, 3, 6]]
    torch.testing.assert_close(vals, torch.topk(x, 7)[0], equal_nan=True)
