"""A 16-bit contraction whose operand is computed in f32 (RMSNorm's normed x, SiLU(gate) * up)
still runs on tensor cores: eager holds that operand as a bf16 tensor, so rounding it to bf16
on the way into shared memory is what eager does (Loop IR marks the Accum `bf16 operands`). An
f32 contraction over 16-bit inputs is not rounded: it keeps the CUDA-core path."""
import torch
import torch.nn.functional as F

from conftest import run_and_compare
from strata.loop.ir import Accum

BF16 = torch.bfloat16


def rms_linear(x, g, w):
    """HF's LlamaRMSNorm then a projection: statistics in f32, the normed x back in bf16."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
    return F.linear(g * h.to(x.dtype), w)


def swiglu_down(g, u, w):
    return F.linear(F.silu(g) * u, w)


def _modes(prog):
    return [k.mode for k in prog.lowered.tile.kernels]


def _accums(prog):
    return [s for k in prog.lowered.loop.kernels for s in _walk(k.body) if isinstance(s, Accum)]


def _walk(body):
    for s in body:
        yield s
        yield from _walk(getattr(s, "body", ()))


def test_rmsnorm_prologue_takes_tensor_cores():
    x, g, w = torch.randn(1, 9, 64).to(BF16), torch.randn(64).to(BF16), torch.randn(40, 64).to(BF16)
    prog = run_and_compare(rms_linear, (x, g, w), contraction=True)
    assert "mma" in _modes(prog), prog.ir("tile")
    assert "bf16 operands" in prog.ir("loop")


def test_silu_times_up_prologue_takes_tensor_cores():
    g, u, w = (torch.randn(9, 48).to(BF16), torch.randn(9, 48).to(BF16), torch.randn(33, 48).to(BF16))
    prog = run_and_compare(swiglu_down, (g, u, w), contraction=True)
    assert _modes(prog) == ["mma"], prog.ir("tile")


def test_an_f32_matmul_of_16_bit_inputs_is_not_rounded():
    def f32_mm(a, b):
        return (a.float() * 3) @ b.float()
    a, b = torch.randn(9, 40).to(BF16), torch.randn(40, 17).to(BF16)
    prog = run_and_compare(f32_mm, (a, b), contraction=True)
    assert "mma" not in _modes(prog)
    assert all(acc.operands is None for acc in _accums(prog))


def test_two_matmuls_sharing_a_normed_operand():
    """gate and up read one RMSNorm: each reduce loop gets its own copy of the whole prologue
    chain (the rsqrt and what it is computed from), not just of the value it reads."""
    def gate_up(x, g, wg, wu):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        n = g * h.to(x.dtype)
        return F.silu(F.linear(n, wg)) * F.linear(n, wu)
    x, g = torch.randn(1, 9, 64).to(BF16), torch.randn(64).to(BF16)
    wg, wu = torch.randn(24, 64).to(BF16), torch.randn(24, 64).to(BF16)
    run_and_compare(gate_up, (x, g, wg, wu), contraction=True)
