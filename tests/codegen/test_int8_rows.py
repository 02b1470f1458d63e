"""The int8 rows kernel (strata/codegen/int8_rows.c, measured by strata.bench.int8_probe): a
prefill's q4_0 / q4_k linear on vpdpbusd with activation rows as lanes, against float64.

Tolerance: the kernel rounds the activations to int8 blocks exactly as QDOT=vnni's rows and
llama.cpp do (quant/formats.py `int8_blocks`, the reference here), and its integer dot products
are exact; what remains is fp32 arithmetic per block (a scale product, the +128 offset taken off,
three FMAs) over K / 32 blocks, so each output is compared with float64 within 1e-4 of
sum_k |x'_k w_k| (x' the rounded activations). A wrong lane, block or scale errs by the size of
a term, orders of magnitude more. Runs where the CPU has AVX512-VNNI (the kernel has no AVX2
path yet), else skips saying so.
"""
import pytest
import torch

from conftest import HAS_CC
from strata.bench.int8_probe import NEEDS, available, int8_rows, load_kernel
from strata.quant.formats import QuantLinear, int8_blocks

pytestmark = [pytest.mark.skipif(not HAS_CC, reason="no C compiler to build the kernel with"),
              pytest.mark.skipif(not available(), reason=f"this CPU lacks one of {', '.join(NEEDS)}: "
                                 "the int8 rows kernel is AVX512-VNNI code only")]


@pytest.fixture(scope="module")
def lib():
    return load_kernel()


def _layer(fmt, k, n, seed):
    torch.manual_seed(seed)
    return QuantLinear.from_linear(torch.nn.Linear(k, n, bias=False), fmt)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k"])
@pytest.mark.parametrize("m,k,n", [(1, 256, 8), (5, 256, 16), (33, 512, 24), (64, 256, 8)])
def test_int8_rows_match_float64_of_the_rounded_activations(lib, fmt, m, k, n):
    layer = _layer(fmt, k, n, seed=m + n)
    x = torch.randn(m, k) * torch.linspace(0.1, 3.0, k)          # blocks of unlike scales
    got = int8_rows(lib, x, layer).double()
    xr, w = int8_blocks(x).double(), layer.weight(torch.float64)
    want = xr @ w.t()
    bound = 1e-4 * (xr.abs() @ w.abs().t()) + 1e-30
    assert ((got - want).abs() <= bound).all(), float(((got - want).abs() / bound).max())


def test_int8_rows_differ_from_float_activations_as_int8_rounding_does(lib):
    """Against the unrounded activations the error is int8 rounding's (well under 2% of the
    output's scale), so the offset and minimum terms are not silently dropped."""
    layer = _layer("q4_k", 512, 16, seed=3)
    x = torch.randn(7, 512)
    got, want = int8_rows(lib, x, layer).double(), x.double() @ layer.weight(torch.float64).t()
    assert float((got - want).abs().max() / want.abs().max()) < 2e-2


def test_int8_rows_refuse_shapes_they_do_not_tile(lib):
    with pytest.raises(ValueError, match="N a multiple of 8"):
        int8_rows(lib, torch.randn(2, 256), _layer("q4_0", 256, 12, seed=1))
