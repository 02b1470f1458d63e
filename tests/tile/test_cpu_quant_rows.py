"""c_qdot: a quantized matrix-vector row's block loop, matched by what it computes and printed as
AVX-512 code; run natively and compared with float64 eager at odd shapes, for both formats, bf16
and fp32 activations, with and without a bias, on the AVX-512 path and the path as written
(cpu-avx2), and refused for a block loop that is not a format's dequantization."""
import pytest
import torch
import torch.nn.functional as F

from conftest import HAS_CC
from strata.quant.formats import QuantLinear
from strata.targets import host
from test_cpu_dot import BF16, assert_matches, cpu_compile

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")
AVX512 = host().has("avx512f")


def quant_linear(fmt, k, n, bias, dtype):
    torch.manual_seed(k * n)
    layer = QuantLinear.from_linear(torch.nn.Linear(k, n, bias=bias), fmt).eval()
    return layer if dtype == torch.float32 else layer.to(dtype)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("k,n,bias,dtype", [(96, 37, False, BF16), (64, 1, True, BF16),
                                            (352, 5, False, torch.float32),
                                            (224, 13, True, torch.float32)], ids=str)
def test_a_quantized_row_runs_as_vector_blocks(fmt, k, n, bias, dtype):
    layer = quant_linear(fmt, k, n, bias, dtype)
    x = torch.randn(1, k).to(dtype)
    prog, _ = cpu_compile(layer, (x,))
    assert f"{fmt} blocks as zmm code" in prog.source("c")
    assert_matches(prog, layer, (x,))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_the_loop_as_written_runs_where_there_is_no_avx512(fmt):
    layer, x = quant_linear(fmt, 160, 11, True, BF16), torch.randn(1, 160).to(BF16)
    prog, _ = cpu_compile(layer, (x,), target="cpu-avx2")
    assert "zmm code" in prog.source("c")          # printed under #if, compiled without it
    assert_matches(prog, layer, (x,))


def test_an_edge_case_input_row():
    layer = quant_linear("q4_0", 64, 7, False, torch.float32)
    x = torch.tensor([[0.0] * 31 + [1e30] + [-0.0] * 31 + [-3.5]])
    prog, _ = cpu_compile(layer, (x,))
    assert_matches(prog, layer, (x,))


def test_a_block_loop_that_is_no_format_keeps_its_loop():
    def off_by_one(x, q, d):             # nibbles minus 7: not q4_0's minus 8
        w = torch.cat([q & 15, q >> 4], -1).to(torch.float32) - 7
        return F.linear(x, (w * d.to(torch.float32)).flatten(-2))
    x = torch.randn(1, 64)
    q = torch.randint(0, 256, (9, 2, 16), dtype=torch.uint8)
    d = (torch.rand(9, 2, 1) * 0.01).to(torch.float16)
    prog, _ = cpu_compile(off_by_one, (x, q, d))
    assert "zmm code" not in prog.source("c")
    assert_matches(prog, off_by_one, (x, q, d))


@pytest.mark.skipif(not AVX512, reason="this CPU has no AVX-512F: the vector blocks do not run here")
def test_the_row_differs_from_the_scalar_loop_only_in_rounding():
    layer, x = quant_linear("q8_0", 2048, 64, False, BF16), torch.randn(1, 2048).to(BF16)
    fast, _ = cpu_compile(layer, (x,))
    slow, _ = cpu_compile(layer, (x,), target="cpu-avx2")
    exact = F.linear(x.double(), layer.weight(torch.float64))
    for prog in (fast, slow):
        err = ((prog(x).double() - exact).abs().max() / exact.abs().max()).item()
        assert err < 8e-3, err                     # bf16 output: one rounding, a few ulps
