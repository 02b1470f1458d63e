"""Row numbers a caller passes (token ids into an embedding, an index_select's indices) are
checked before a native call (frontend/index_bounds.py, runtime/native.py): one past the table
or negative is an error naming the input and the table's rows, where the kernel would have read
outside the table (a segmentation fault); in range, the result is eager's."""
import pytest
import torch
from torch import nn

import strata
from conftest import HAS_CC
from strata.core.errors import InputMismatch

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


class Lookup(nn.Module):
    """An embedding read through a view of the ids, and an index_select of its rows."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(37, 8)
        self.table = nn.Parameter(torch.randn(11, 8))

    def forward(self, ids, rows):
        return self.emb(ids.view(-1)) + torch.index_select(self.table, 0, rows)


@pytest.fixture
def program():
    torch.manual_seed(0)
    m = Lookup().eval()
    ids, rows = torch.tensor([[0, 36, 5]]), torch.tensor([10, 0, 3])
    with torch.no_grad():
        p = strata.compile(m, (ids, rows), device="cpu")
        torch.testing.assert_close(p(ids, rows), m(ids, rows))
    return p


@pytest.mark.parametrize("ids,rows,says", [
    ([[0, 37, 5]], [10, 0, 3], "index 37 is out of range for embedding at"),
    ([[0, -1, 5]], [10, 0, 3], "index -1 is out of range for embedding"),
    ([[0, 1, 5]], [11, 0, 3], "index 11 is out of range for index_select"),
    ([[0, 1, 10**12]], [1, 0, 3], "which has 37 rows (0..36)"),
])
def test_an_index_out_of_its_table_is_an_error(program, ids, rows, says):
    with torch.no_grad(), pytest.raises(InputMismatch, match=r"input \w+: ") as e:
        program(torch.tensor(ids), torch.tensor(rows))
    assert says in str(e.value)


def test_through_torch_compile_too():
    torch._dynamo.reset()
    emb = nn.Embedding(5, 4)
    compiled = torch.compile(emb, backend="strata")
    with torch.no_grad():
        torch.testing.assert_close(compiled(torch.tensor([4, 0])), emb(torch.tensor([4, 0])))
        with pytest.raises(InputMismatch, match="index 5 is out of range for embedding"):
            compiled(torch.tensor([5, 0]))
