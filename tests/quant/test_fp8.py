"""FP8: torch._scaled_mm and FP8Linear compiled for the CPU and the simulator, against eager."""
import sys
from pathlib import Path

import pytest
import torch

import strata
from strata.bench.check import verify
from strata.quant.formats import quantize
from strata.quant.fp8 import E4M3_MAX, FP8Linear, to_e4m3_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from model_helpers import hf_model  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _operands(m, k, n, dtype=E4M3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * 8).to(dtype), (torch.randn(n, k, generator=g) * 8).to(dtype)


@pytest.mark.parametrize("device", ["cpu", "sim"])
@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
def test_scaled_mm_matches_eager(device, rows, out):
    """One scale or a scale per row of a and column of b; bf16 and f32 results; a bias; M = 37
    and K = 48, N = 40 (odd tiles). The product of FP8 values is exact in f32, so only the order
    of the sum differs from eager's."""
    m, k, n = 37, 48, 40
    a, b = _operands(m, k, n)
    sa, sb = (torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5) if rows else \
        (torch.tensor(0.25), torch.tensor(3.0))
    bias = torch.randn(n).to(out)

    def f(a, b, sa, sb, bias):
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=out) + bias
    got = strata.compile(f, (a, b, sa, sb, bias), device=device)(a, b, sa, sb, bias)
    want = f(a, b, sa, sb, bias)
    assert got.dtype == out and got.shape == (m, n)
    tol = 1e-2 if out == torch.bfloat16 else 1e-5
    assert ((got.double() - want.double()).norm() / want.double().norm()) < tol


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_scaled_mm_one_row_and_e5m2(dtype):
    """A decode-shaped product (M = 1) of either FP8 format, through `verify` (its float64
    reference computes _scaled_mm in float64)."""
    a, b = _operands(1, 64, 29, dtype, seed=1)
    sa, sb = torch.tensor(0.5), torch.tensor(0.125)

    def f(a, b):
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    prog = strata.compile(f, (a, b), device="cpu")
    assert verify(prog, f, (a, b)).passed


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_rounding_to_fp8_as_torch_does(device):
    """x rounded to e4m3 per row (FP8Linear's activations), bit for bit: a row of zeros, a row
    beyond 448 (saturated by the scale), a NaN row stays NaN."""
    x = torch.randn(5, 33) * 100
    x[1] = 0
    x[2] *= 1e4
    x[4, 3] = float("nan")

    def f(x):
        q, s = to_e4m3_rows(x)
        return q, s
    got = strata.compile(f, (x,), device=device)(x)
    want = f(x)
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0, equal_nan=True)


def test_fp8_linear_rounds_within_half_a_step():
    """Weights come back within half an e4m3 step of their row's scale grid (2^-4 relative for
    values over the smallest normal), an all-zero row stays zero, and the layer is close to the
    float one (FP8's 3 mantissa bits: about 3% here)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 24)
    with torch.no_grad():
        linear.weight[5] = 0
    layer = FP8Linear.from_linear(linear)
    back = layer.qw.float() * layer.scale
    w = linear.weight.detach()
    big = w.abs() >= 2.0 ** -6 * layer.scale
    assert ((back - w).abs() <= w.abs() * 2.0 ** -4 + 1e-12)[big].all()
    assert back[5].abs().max() == 0 and layer.qw.float().abs().max() <= E4M3_MAX
    x = torch.randn(3, 7, 96)
    rel = (layer(x) - linear(x)).norm() / linear(x).norm()
    assert 1e-3 < rel < 0.06


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_model_prefill_matches_eager(dtype):
    """A tiny Llama with every linear in FP8 (`strata.quantize(model, "fp8")`): strata's logits
    against eager's FP8 model. In float32 within a contraction's 1e-4; in bf16 eager itself is
    about 7% off the float32 FP8 model (bf16 activations move values across e4m3's rounding
    edges, each a step of 2^-4), so strata is held to 1.5 times eager's own distance from it."""
    model = quantize(hf_model("llama", seed=3), "fp8").eval()
    assert sum(isinstance(m, FP8Linear) for m in model.modules()) == 7 * 2 + 1
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5]])
    with torch.no_grad():
        exact = model(ids).logits.double()
        model.to(dtype)
        assert model.model.layers[0].mlp.up_proj.qw.dtype == E4M3
        want = model(ids).logits.double()
        got = strata.compile(model, (ids,), device="cpu")(ids)
    got = (got.logits if hasattr(got, "logits") else got[0]).double()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()
    if dtype == torch.float32:
        assert rel(got, want) < 1e-4
    else:
        assert rel(got, exact) < 1.5 * rel(want, exact), (rel(got, exact), rel(want, exact))


def test_fp8_linear_through_torch_compile():
    """`torch.compile(layer, backend="strata")` on an FP8Linear (3-d activations, a bias): the
    same numbers as eager, a second input too."""
    layer = FP8Linear.from_linear(torch.nn.Linear(256, 128)).eval()
    compiled = torch.compile(layer, backend="strata")
    with torch.no_grad():
        for seed in (0, 1):
            x = torch.randn(4, 7, 256, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)


EDGES = {
    "0-d": (lambda x: (x * 3).to(E4M3), lambda: (torch.tensor(1.7),)),
    "empty": (lambda x: x.to(E4M3), lambda: (torch.randn(0, 5),)),
    "size 1, e5m2": (lambda x: x.to(E5M2).float() + 1, lambda: (torch.randn(1),)),
    "prime, past 448": (lambda x: x.to(E4M3), lambda: (torch.randn(7, 13) * 200,)),
    "non-contiguous": (lambda y: y.t().float() * 2, lambda: ((torch.randn(5, 3) * 4).to(E4M3),)),
    "in place": (lambda buf, x: buf.copy_(x), lambda: (torch.zeros(4, 6).to(E4M3), torch.randn(4, 6))),
}


@pytest.mark.parametrize("device", ["cpu", "sim"])
@pytest.mark.parametrize("edge", EDGES, ids=str)
def test_fp8_edges(edge, device):
    """The edges users hit, bit for bit against eager: a 0-d tensor, an empty one, size 1, a
    prime shape saturating at 448, a transposed FP8 input, a copy into an FP8 tensor in place
    (the caller's tensor holds the result)."""
    fn, make = EDGES[edge]
    torch.manual_seed(0)
    inputs = make()
    want = fn(*[x.clone() for x in inputs])
    got = strata.compile(fn, inputs, device=device)(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(torch.uint8) if got.dtype in (E4M3, E5M2) else got,
                       want.view(torch.uint8) if want.dtype in (E4M3, E5M2) else want)
    if edge == "in place":
        assert torch.equal(inputs[0].view(torch.uint8), want.view(torch.uint8))


def test_fp8_prefill_runs_on_bf16_pairs_where_the_cpu_has_them():
    """FP8 values are exact in bf16 and their products exact in f32, so an FP8Linear's product
    at 64 rows takes the bf16 pairs form (vdpbf16ps) with its e4m3 weight packed once into a bf16
    panel at load, and its e4m3 activations stored in bf16 (contraction.bf16_exact); without
    AVX512-BF16 (cpu-avx2) it stays the f32 outer form. Same numbers as eager either way."""
    from strata.core.context import Context
    layer = FP8Linear.from_linear(torch.nn.Linear(256, 96, bias=False)).eval()
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    forms = {}
    for target in ("cpu-znver4", "cpu-avx2"):
        prog = strata.compile(layer, (x,), device="cpu", until="c", ctx=Context(target=target))
        [knobs] = [dict(t.knobs) for t in prog.lowered.tile.kernels if "FORM" in dict(t.knobs)]
        forms[target] = (knobs["FORM"], knobs.get("PACK"))
    assert forms == {"cpu-znver4": ("pairs", "once"), "cpu-avx2": ("outer", None)}
    with torch.no_grad():
        got = strata.compile(layer, (x,), device="cpu")(x)
        want = layer(x)
    assert ((got.double() - want.double()).norm() / want.double().norm()) < 1e-2   # bf16 out
