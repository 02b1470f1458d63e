"""On a GPU a decode step's RMSNorm sum goes into the projection that reads it: each block of the
projection sums the row itself, its threads together (loop/fuse.py `block_scalars`,
tile/passes/block_prelude_reduce.py), instead of a one-block kernel the projection waits for.
Checked on the simulator against eager (float64 reference) for the tensor-core GEMV (sm_80, sm_90a:
split along K), the CUDA-core one (f32), the byte rows of Q8_0 / Q4_0 weights, and odd sizes;
two tokens (a sum per row) and the CPU keep the norm's own kernel."""
import pytest
import torch
from torch import nn

import strata
from strata.bench import check
from strata.core.context import Context
from strata.quant.formats import quantize


class NormProj(nn.Module):
    """Llama's RMSNorm, then a projection without bias."""

    def __init__(self, hidden: int, out: int):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(hidden))
        self.proj = nn.Linear(hidden, out, bias=False)

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        h = (x.float() * torch.rsqrt(var + 1e-5)).to(x.dtype) * self.weight
        return self.proj(h)


def _compiled(module, x, target):
    module.requires_grad_(False)
    return strata.compile(module, [x], device="sim", ctx=Context(target=target))


def _check(program, module, x, dtype):
    got = program(x)
    with torch.no_grad():
        want = module.double()(x.double())
    res = check.compare("out", dtype, got.float().numpy(), want.numpy(), check.tolerance(dtype, True))
    assert res.passed, f"rel err {res.rel:.3g} (tol {res.tol})"


def _fused(program) -> bool:
    return not any("mean" in k.name for k in program.lowered.kernel.kernels)


def _block_wide(program) -> bool:
    return ", block)" in program.lowered.text("tile")


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("hidden,out", [(2048, 2560), (1000, 777), (64, 3)])
def test_one_token_sums_its_norm_in_the_projection(target, dtype, hidden, out):
    torch.manual_seed(hidden + out)
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    module = NormProj(hidden, out).to(tdt)
    x = torch.randn(1, 1, hidden).to(tdt)
    program = _compiled(module, x, target)
    assert _fused(program)
    # the block's threads sum it together, unless the block is under a warp (f32's 3-wide
    # projection: 4 threads, each summing the row itself)
    kernels = program.lowered.kernel.kernels
    assert _block_wide(program) != (len(kernels) == 1 and kernels[0].block < 32)
    _check(program, module, x, dtype)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_byte_weight_rows_sum_the_norm_too(fmt):
    torch.manual_seed(1)
    module = quantize(NormProj(2048, 256), fmt)
    x = torch.randn(1, 1, 2048)
    program = _compiled(module, x, "sm_90a")
    assert _fused(program) and _block_wide(program)
    _check(program, module, x, "f32")


def test_two_tokens_and_the_cpu_keep_the_norms_kernel():
    torch.manual_seed(2)
    module = NormProj(256, 96)
    two = torch.randn(1, 2, 256)
    program = _compiled(module, two, "sm_90a")
    # a sum per row would be recomputed per column: its own kernel
    assert not _fused(program) and not _block_wide(program)
    _check(program, module, two, "f32")
    cpu = strata.compile(module.requires_grad_(False), [two[:, :1]], ctx=Context(target="cpu"),
                         until="loop")
    assert any("mean" in k.name for k in cpu.lowered.loop.kernels)
