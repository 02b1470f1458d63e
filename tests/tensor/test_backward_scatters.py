"""The Tensor IR rules training's backward graphs need (issue 58) against torch eager: slicing's
backward (slice_scatter), cross-entropy's one-hot (scatter) and embedding's (index_put with an
N-D index), at the edges: steps, negative dims, empty pieces, one position, repeated ones."""
import pytest
import torch

from strata.core.errors import UnsupportedOp
from tensor_helpers import check


@pytest.mark.parametrize("dim,start,end,step,src", [
    (1, 2, 9, 3, (4, 3)), (-1, 5, None, 1, (4, 6)), (0, 0, 1, 1, (1, 11)), (1, 4, 4, 1, (4, 0)),
])
def test_slice_scatter(dim, start, end, step, src):
    x, s = torch.randn(4, 11), torch.randn(*src)
    check(lambda x, s: torch.slice_scatter(x, s, dim, start, end, step), x, s)


def test_scatter_of_values_and_of_sources():
    x, src = torch.randn(5, 7), torch.randn(5, 2)
    one = torch.randint(0, 7, (5, 1))
    two = torch.cat([one, (one + 3) % 7], 1)
    check(lambda x, i: torch.zeros_like(x).scatter(1, i, -1.0), x, one)        # the one-hot
    check(lambda x, i, s: torch.scatter(x, 1, i, s), x, two, src)
    check(lambda x, i, s: torch.scatter(x, 0, i, s), torch.randn(3, 4),
          torch.randint(0, 3, (1, 4)), torch.randn(1, 4))


def test_scatter_beyond_what_it_supports_is_one_sentence():
    with pytest.raises(UnsupportedOp, match="only one spanning the other dims"):
        check(lambda x, i, s: torch.scatter(x, 1, i, s), torch.randn(5, 7),
              torch.randint(0, 7, (3, 1)), torch.randn(3, 1))


@pytest.mark.parametrize("accumulate", [True, False])
def test_index_put_with_an_nd_index(accumulate):
    w, g = torch.randn(10, 4), torch.randn(3, 5, 4)
    ids = torch.randint(0, 10, (3, 5)) if accumulate else torch.randperm(10)[:6].reshape(2, 3)
    g = g if accumulate else torch.randn(2, 3, 4)
    check(lambda w, i, g: w.index_put((i,), g, accumulate=accumulate), w, ids, g)
