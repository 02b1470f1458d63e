"""cpu_split_groups: decode attention with grouped K and V (each kv head shared by c query heads)
runs q @ k^T and P @ V as products of c rows per group, natively, against eager at odd cache
lengths (one position: no product, still right), for bf16 and f32, groups of 8 and of 2; attention with one kv head per query head (no
groups) and a prefill (an M axis already) keep their schedules."""
import pytest
import torch

from conftest import HAS_CC
from test_cpu_dot import BF16, assert_matches, cpu_compile

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


class Attention(torch.nn.Module):
    """transformers' eager attention: repeat_kv's expand and reshape, then two matmuls."""

    def forward(self, q, k, v):
        b, kv, n, d = k.shape
        c = q.shape[1] // kv
        k = k[:, :, None].expand(b, kv, c, n, d).reshape(b, kv * c, n, d)
        v = v[:, :, None].expand(b, kv, c, n, d).reshape(b, kv * c, n, d)
        p = torch.softmax((q @ k.transpose(2, 3)).float() * d ** -0.5, -1).to(q.dtype)
        return p @ v


def inputs(heads, kv, s, n, d, dtype):
    torch.manual_seed(heads * n + s)
    return (torch.randn(1, heads, s, d).to(dtype), torch.randn(1, kv, n, d).to(dtype),
            torch.randn(1, kv, n, d).to(dtype))


def matmul_kernels(prog) -> list:
    return [k for k in prog.lowered.tile.kernels if k.matmul is not None]


@pytest.mark.parametrize("dtype", [BF16, torch.float32], ids=str)
@pytest.mark.parametrize("heads,kv,n", [(32, 4, 37), (4, 2, 2), (6, 3, 129), (4, 2, 1)], ids=str)
def test_grouped_decode_attention_runs_as_group_products(heads, kv, n, dtype):
    x = inputs(heads, kv, 1, n, 64, dtype)
    prog, log = cpu_compile(Attention(), x)
    assert_matches(prog, Attention(), x)
    if n == 1:
        return                                   # one cached position: no N axis to split for
    c = heads // kv
    assert log.count(f"as {kv} groups of {c} rows (the N side reads a0 // {c})") == 2, log
    tiles = matmul_kernels(prog)
    assert len(tiles) == 2 and all(k.extent(k.matmul.m) == c for k in tiles)
    assert "declined, a matrix-vector product" not in log


def test_ungrouped_attention_and_a_prefill_keep_their_schedules():
    x = inputs(8, 8, 1, 37, 64, BF16)          # one kv head per query head: nothing to split
    prog, log = cpu_compile(Attention(), x)
    assert_matches(prog, Attention(), x)
    assert "rows (the N side reads" not in log and not matmul_kernels(prog)
    x = inputs(8, 2, 5, 5, 64, BF16)           # a prefill: the query rows are the M axis
    prog, log = cpu_compile(Attention(), x)
    assert_matches(prog, Attention(), x)
    assert "rows (the N side reads" not in log and len(matmul_kernels(prog)) == 2
