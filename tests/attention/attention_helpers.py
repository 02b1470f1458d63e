"""Run an attention program through every stage and the simulator (also the sanitizer) and
compare with eager float64; attention must be one fused kernel (two with split-KV: the split
kernel and its combine)."""
import torch
from conftest import run_and_compare

from strata.bench import check
from strata.core.context import Context


def check_fused(fn, inputs, knobs=None, kernels=1):
    """fn through the simulator vs eager float64 (docs/design.md tolerances); returns the Program."""
    prog = run_and_compare(fn, inputs, contraction=True, ctx=Context(knobs=dict(knobs or {})))
    got = prog.lowered.kernel.kernels
    assert len(got) == kernels, [k.name for k in got]
    assert all(k.mode == "attention" for k in prog.lowered.tile.kernels)
    return prog


def compare_with(prog, fn, run_inputs, ref_inputs):
    """prog run on `run_inputs` must match eager float64 on `ref_inputs` (e.g. the same inputs
    without the values the kernel must never read)."""
    got = prog.run_numpy(run_inputs)
    ref = check.eager_reference(fn, ref_inputs)
    for name, g, r in zip(prog.lowered.kernel.outputs, got, ref):
        dt = prog.lowered.kernel.buffer(name).dtype
        res = check.compare(name, dt, g, r, check.tolerance(dt, True))
        assert res.passed, f"{name}: rel err {res.rel:.3g}, max abs {res.max_abs:.3g} (tol {res.tol})"


def sdpa_mask(kind: str, shape=(1, 2, 33, 70)) -> torch.Tensor:
    """The masks transformers passes SDPA: additive fp16 with a run of -inf keys, or boolean
    with key 0 always kept."""
    if kind == "additive":
        mask = torch.randn(shape).to(torch.float16)
        mask[..., 5:9] = float("-inf")
    else:
        mask = torch.rand(shape) > 0.3
        mask[..., 0] = True
    return mask


def masked_sdpa(q, k, v, mask):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
