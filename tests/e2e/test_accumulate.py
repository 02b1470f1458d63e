"""scatter_add, scatter_reduce, index_add, index_reduce, index_put(accumulate), histc and
embedding_bag (tensor/rules_accumulate.py) against eager: repeated and negative positions,
an index smaller than the source, empty bags, padding_idx, values outside histc's range."""
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_and_compare


def _put_add(x, i, v):
    x = x.clone()
    x.index_put_((i,), v, accumulate=True)
    return x


@pytest.mark.parametrize("fn, args", [
    pytest.param(lambda x, i: torch.zeros(5, 3).scatter_add(0, i, x),
                 (torch.randn(4, 3), torch.randint(0, 5, (4, 3))), id="scatter_add"),
    pytest.param(lambda x, i: torch.ones(5, 4).scatter_add(1, i, x),
                 (torch.randn(6, 7), torch.randint(0, 4, (3, 2))), id="scatter_add-small-index"),
    pytest.param(lambda x, i: torch.ones(5, 3).index_add(0, i, x, alpha=2.0),
                 (torch.randn(4, 3), torch.tensor([0, 4, 0, 2])), id="index_add-repeats"),
    pytest.param(lambda x, i: torch.zeros(2, 6, dtype=torch.bfloat16).index_add(1, i, x),
                 (torch.randn(2, 3, dtype=torch.bfloat16), torch.tensor([5, 5, 1])), id="index_add-bf16"),
    pytest.param(lambda x, i: torch.zeros(5, 3).scatter_reduce(0, i, x, "amax", include_self=False),
                 (torch.randn(4, 3), torch.randint(0, 5, (4, 3))), id="scatter_reduce-amax"),
    pytest.param(lambda x, i: torch.ones(5, 3).scatter_reduce(0, i, x, "mean"),
                 (torch.randn(4, 3), torch.randint(0, 5, (4, 3))), id="scatter_reduce-mean"),
    pytest.param(lambda x, i: torch.full((5, 3), 2.0).scatter_reduce(0, i, x, "prod", include_self=False),
                 (torch.randn(4, 3), torch.randint(0, 5, (4, 3))), id="scatter_reduce-prod"),
    pytest.param(lambda x, i: torch.zeros(7, 3, dtype=torch.long).scatter_reduce(0, i, x, "sum"),
                 (torch.randint(-9, 9, (11, 3)), torch.randint(0, 7, (11, 3))), id="scatter_reduce-int"),
    pytest.param(lambda x, i: torch.zeros(5, 3).index_reduce(0, i, x, "amin"),
                 (torch.randn(4, 3), torch.tensor([1, 1, 3, 0])), id="index_reduce-amin"),
    pytest.param(_put_add, (torch.zeros(6, 2), torch.tensor([1, -1, 1]), torch.randn(3, 2)),
                 id="index_put-accumulate"),
    pytest.param(lambda x: torch.histc(x, bins=7, min=-2, max=2), (torch.randn(50),), id="histc"),
    pytest.param(lambda x: torch.histc(x, bins=5), (torch.randn(4, 9),), id="histc-data-range"),
    pytest.param(lambda x: torch.histc(x, bins=3), (torch.full((6,), 2.5),), id="histc-one-value"),
])
def test_accumulate(fn, args):
    run_and_compare(fn, args)


@pytest.mark.parametrize("fn, args", [
    pytest.param(lambda i, o, w: F.embedding_bag(i, w, o, mode="sum"),
                 (torch.randint(0, 10, (8,)), torch.tensor([0, 3, 3, 5]), torch.randn(10, 4)), id="sum-empty-bag"),
    pytest.param(lambda i, o, w: F.embedding_bag(i, w, o, mode="mean", padding_idx=2),
                 (torch.tensor([2, 1, 2, 3, 4, 2, 9, 0]), torch.tensor([0, 3, 5]), torch.randn(10, 4)),
                 id="mean-padding_idx"),
    pytest.param(lambda i, o, w: F.embedding_bag(i, w, o, mode="max"),
                 (torch.randint(0, 10, (8,)), torch.tensor([0, 3, 5]), torch.randn(10, 4)), id="max"),
    pytest.param(lambda i, w, p: F.embedding_bag(i, w, per_sample_weights=p, mode="sum"),
                 (torch.randint(0, 10, (3, 4)), torch.randn(10, 5), torch.rand(3, 4)), id="2d-per-sample-weights"),
    pytest.param(lambda i, o, w: F.embedding_bag(i, w, o, mode="sum", include_last_offset=True),
                 (torch.randint(0, 10, (8,)), torch.tensor([0, 3, 8]), torch.randn(10, 4)), id="include_last_offset"),
    pytest.param(lambda i, w: torch.nn.EmbeddingBag.from_pretrained(w, mode="mean")(i),
                 (torch.randint(0, 10, (2, 5)), torch.randn(10, 3)), id="module"),
])
def test_embedding_bag(fn, args):
    run_and_compare(fn, args)
