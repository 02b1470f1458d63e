"""FP8 on Hopper (issue 54 item 3): torch._scaled_mm's e4m3 / e5m2 operands run wgmma's k32 form
on sm_90a, fed by TMA (one byte an element: TILE_K 128 is the 128B swizzle), row and column
scales, bias and the bf16 rounding in the epilogue. Simulated against eager float64 at awkward
shapes, its PTX built by NVRTC; the declines (FP8 read along M or N, elsewhere than sm_90a) say
why and still compute the right numbers on CUDA cores."""
import pytest
import torch

import strata
from strata.core.context import Context
from strata.kernel_ir.ir import Wgmma, walk
from strata.quant.fp8 import FP8Linear
from test_wgmma_schedule import SM90A, _check, _compile, run_wgmma

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _fp8(*shape, dtype=E4M3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 4).to(dtype)


def scaled(out=torch.bfloat16):
    def f(a, b, sa, sb):
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=out)
    return f


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=str)
@pytest.mark.parametrize("m,k,n", [(100, 208, 72), (7, 48, 16), (129, 384, 136)], ids=str)
def test_scaled_mm_runs_on_wgmma_k32(m, k, n, dtype):
    """Row scales of A, column scales of B; M, N off the tiles (TMA zero-fills the edges), K of
    one to three 128-element steps."""
    inputs = (_fp8(m, k, dtype=dtype), _fp8(n, k, dtype=dtype, seed=1),
              torch.rand(m, 1) + 0.5, torch.rand(1, n) + 0.5)
    prog = run_wgmma(scaled(), inputs)
    wg = [s for s in walk(prog.lowered.kernel.kernels[0].body) if isinstance(s, Wgmma)]
    kind = "e4m3" if dtype == E4M3 else "e5m2"
    assert wg and all(s.k == 32 and s.dtype.endswith(kind) for s in wg)
    assert dict(prog.lowered.tile.kernels[0].knobs)["TILE_K"] == 128
    assert f"k32.f32.{kind}.{kind} " in prog.source("cuda")


def test_per_tensor_scales_bias_and_f32_out():
    m, k, n = 65, 96, 40
    bias = torch.randn(n)

    def f(a, b, bias):
        y = torch._scaled_mm(a, b.t(), scale_a=torch.tensor(0.5), scale_b=torch.tensor(2.0),
                             out_dtype=torch.float32)
        return y + bias
    run_wgmma(f, (_fp8(m, k), _fp8(n, k, seed=1), bias))


def test_fp8_linear_layer_and_tile_k_pins():
    """FP8Linear as a module: its activations rounded to e4m3 are stored in e4m3 by a kernel of
    their own (materialize_prologue does so for any FP8 operand: fused, the product would run on
    CUDA cores) and the product runs on wgmma; TILE_K pinned to 64 (the 64B swizzle) stays
    right; PROLOGUE=fuse keeps the prologue fused, on CUDA cores."""
    layer = FP8Linear.from_linear(torch.nn.Linear(96, 48, bias=False))
    x = torch.randn(33, 96, dtype=torch.bfloat16)
    fused = _compile(layer, (x,), {"PROLOGUE": "fuse"})
    assert "wgmma" not in [k.mode for k in fused.lowered.tile.kernels]
    prog = _compile(layer, (x,))
    tile = prog.lowered.tile
    assert "wgmma" in [k.mode for k in tile.kernels], prog.ir("tile")
    assert any(b.dtype == "f8e4m3" and b.name.endswith("_operand") for k in tile.kernels
               for b in k.buffers), prog.ir("tile")
    _check(prog, layer, (x,))
    inputs = (_fp8(70, 256), _fp8(24, 256, seed=1), torch.rand(70, 1), torch.rand(1, 24))
    prog = run_wgmma(scaled(), inputs, {"TILE_K": "64", "STAGES": "2"})
    assert "64B" in prog.ir("kernel")


def test_declines_say_why():
    """B stored (K, N) (torch._scaled_mm(a, b), b N-contiguous): wgmma reads FP8 K-major only,
    so the kernel runs on CUDA cores, right; sm_90 (no 'a') has no wgmma at all."""
    a, b_rows, b = _fp8(33, 64), _fp8(64, 48, seed=1), _fp8(48, 64, seed=1)

    def f(a, b):
        return torch._scaled_mm(a, b, scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0),
                                out_dtype=torch.bfloat16)
    ctx = Context(target=SM90A)
    prog = strata.compile(f, (a, b_rows), ctx=ctx)
    assert "wgmma" not in [k.mode for k in prog.lowered.tile.kernels]
    assert any("FP8 K-major only" in m for m in ctx.messages), ctx.messages
    _check(prog, f, (a, b_rows))
    g = scaled()
    inputs = (a, b, torch.tensor(1.0), torch.tensor(1.0))
    ctx = Context(target="sm_90")
    prog = strata.compile(g, inputs, ctx=ctx)
    assert "wgmma" not in [k.mode for k in prog.lowered.tile.kernels]
    assert any("sm_90 has no wgmma" in m for m in ctx.messages), ctx.messages
    _check(prog, g, inputs)


def test_tiny_llama_prefill_in_fp8_on_wgmma_matches_eager():
    """A tiny Llama (bf16) with every linear in FP8, 72 tokens on sm_90a in the simulator: every
    projection on wgmma's e4m3 form, and the logits as close to the float32 FP8 model as eager's
    own bf16 run is (within 1.5 times; bf16 activations move values across e4m3's steps: ~7%)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    from model_helpers import hf_model
    from strata.quant.formats import quantize
    model = quantize(hf_model("llama", seed=3), "fp8").eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5] * 8])
    with torch.no_grad():
        exact = model(ids).logits.double()
        model.to(torch.bfloat16)
        want = model(ids).logits.double()
        prog = strata.compile(model, (ids,), device="sim", ctx=Context(target=SM90A))
        got = prog(ids)
    got = (got.logits if hasattr(got, "logits") else got[0]).double()
    modes = [k.mode for k in prog.lowered.tile.kernels]
    # per layer q, k, v, o, gate with up (one kernel, two K loops) and down; then lm_head
    assert modes.count("wgmma") == 6 * 2 + 1 and "matmul" not in modes and "mma" not in modes

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()
    assert rel(got, exact) < 1.5 * rel(want, exact), (rel(got, exact), rel(want, exact))
