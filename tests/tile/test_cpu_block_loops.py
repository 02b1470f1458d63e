"""cpu_block_loops: loops whose indices divide by a block size run as blocks (a quantized weight's
32-wide blocks), sums through per-position partial sums; run natively and compared with float64
eager at odd block counts and sizes, for sums, a max, elementwise dequantization and a
QuantLinear, and with the knob off."""
import pytest
import torch
import torch.nn.functional as F

from conftest import HAS_CC
from strata.quant.formats import QuantLinear
from test_cpu_dot import BF16, HAS_DP, assert_matches, cpu_compile, knobs_of

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


def blocked_gemv(x, q, d):
    """A q8_0-style matrix-vector product: x (1, K) by int8 blocks q (N, K/c, c) scaled by d."""
    n = q.shape[0]
    return F.linear(x, (q.to(torch.float32) * d.to(torch.float32)).reshape(n, -1))


@pytest.mark.parametrize("n,blocks,c", [(5, 4, 32), (7, 3, 33), (1, 2, 8), (13, 5, 17)], ids=str)
def test_a_blocked_gemv_runs_in_blocks_with_lane_sums(n, blocks, c):
    x = torch.randn(1, blocks * c)
    q = torch.randint(-127, 128, (n, blocks, c), dtype=torch.int8)
    d = (torch.rand(n, blocks, 1) * 0.01).to(torch.float16)
    prog, log = cpu_compile(blocked_gemv, (x, q, d))
    assert f"in {blocks} blocks of {c}" in log
    source = prog.source("c")
    assert "acc0_lanes" in source and f"_i < {c}; " in source
    assert_matches(prog, blocked_gemv, (x, q, d))


def test_the_knob_keeps_the_loop_whole():
    x, q = torch.randn(1, 96), torch.randint(-127, 128, (6, 3, 32), dtype=torch.int8)
    d = torch.rand(6, 3, 1).to(torch.float16)
    prog, log = cpu_compile(blocked_gemv, (x, q, d), {"BLOCK_LOOPS": 0})
    assert "blocks of" not in log and "_lanes" not in prog.source("c")
    assert knobs_of(prog, "k_linear_reduce")["BLOCK_LOOPS"] == 0
    assert_matches(prog, blocked_gemv, (x, q, d))


def test_a_max_over_blocks_splits_without_lanes():
    def fn(q, d):
        return (q.to(torch.float32) * d).reshape(q.shape[0], -1).amax(-1)
    q, d = torch.randint(-127, 128, (9, 5, 16), dtype=torch.int8), torch.randn(9, 5, 1)
    prog, log = cpu_compile(fn, (q, d))
    assert "in 5 blocks of 16" in log and "_lanes" not in prog.source("c")
    assert_matches(prog, fn, (q, d))


def test_elementwise_dequantization_and_a_bf16_quant_linear():
    def dequant(q, d):
        return (q.to(torch.float32) * d.to(torch.float32)).reshape(q.shape[0], -1)
    q = torch.randint(-127, 128, (11, 3, 32), dtype=torch.int8)
    d = torch.rand(11, 3, 1).to(torch.float16)
    prog, _ = cpu_compile(dequant, (q, d))
    assert_matches(prog, dequant, (q, d))
    layer = QuantLinear.from_linear(torch.nn.Linear(96, 37, bias=True), "q8_0").eval()
    x = torch.randn(1, 1, 96).to(BF16)
    prog, log = cpu_compile(layer, (x,))
    assert "blocks of 32" in log
    assert_matches(prog, layer, (x,))


def test_blocks_inside_blocks_split_by_the_smaller_and_others_decline():
    def nested(x):         # x[r, k // 4] and x[r, k // 8] in one loop over k: blocks of 4
        return (x.reshape(3, 8, 4).sum(-1).repeat_interleave(4, -1) *
                x.reshape(3, 4, 8).amax(-1).repeat_interleave(8, -1)).sum(-1)
    x = torch.randn(3, 32)
    prog, log = cpu_compile(nested, (x,))
    assert "a1 in 8 blocks of 4" in log, log
    assert_matches(prog, nested, (x,))

    def apart(x):          # blocks of 4 and of 6 do not nest
        return (x.reshape(3, 3, 4).sum(-1).repeat_interleave(4, -1) *
                x.reshape(3, 2, 6).amax(-1).repeat_interleave(6, -1)).sum(-1)
    x = torch.randn(3, 12)
    prog, log = cpu_compile(apart, (x,))
    assert "declined, loop a1 has blocks of [4, 6]" in log, log
    assert_matches(prog, apart, (x,))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("m", [2, 70])
def test_a_quantized_matrix_product_reads_its_weight_dequantized_once(fmt, m):
    """cpu_prologue stores a dequantized N-side operand in bf16 first (M > 1), so the product
    takes a bf16 form where the CPU has bf16 dots (not the f32 outer form packing with a
    division per element; without them, as on AVX2, the outer form packs the stored bf16)."""
    layer = QuantLinear.from_linear(torch.nn.Linear(96, 37), fmt).eval()
    x = torch.randn(1, m, 96).to(BF16)
    prog, log = cpu_compile(layer, (x,))
    assert "dequantized computed once into k_linear_reduce_operand_w [37, 96] bf16" in log
    assert (knobs_of(prog, "k_linear_reduce")["FORM"] != "outer") == HAS_DP
    assert_matches(prog, layer, (x,))
