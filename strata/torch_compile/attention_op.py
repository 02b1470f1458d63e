"""`strata::attention` and `strata::attention_backward`: SDPA as a training graph should hold it.

Traced as its math, SDPA's backward reads the softmax weights the forward saved: an Lq x Lk
tensor written by the forward and read back, so neither pass can be one flash kernel. These two
torch ops are FlashAttention's split instead: the forward returns the output and each query's
log-sum-exp of its scores (float32), and the backward recomputes the weights from q, k and that
log-sum-exp. torch_compile/training.py puts `attention` in place of SDPA calls it can (no mask,
no dropout, no GQA) for a GPU target; AOTAutograd then saves (q, k, v, out, lse) and its
backward graph holds one `attention_backward`. Their Tensor IR rules (tensor/rules_attention.py)
spell the same formulas, which the GPU pipeline fuses into flash kernels; the eager bodies here
are what torch runs while tracing and for a check.
"""
from __future__ import annotations

import torch


def _acc(t: torch.Tensor) -> torch.dtype:
    """float32 for half types, the tensor's own dtype for float32 and float64."""
    return torch.promote_types(t.dtype, torch.float32)


def _shared(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """K or V with its heads repeated to q's (GQA: query head h reads KV head h // rep)."""
    if x.dim() < 3 or x.shape[-3] == q.shape[-3]:
        return x
    return x.repeat_interleave(q.shape[-3] // x.shape[-3], dim=-3)


def _folded(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A gradient at q's heads summed over each KV head's group (the inverse of _shared)."""
    if grad.shape == x.shape:
        return grad
    hk = x.shape[-3]
    return grad.view(*x.shape[:-3], hk, grad.shape[-3] // hk, *x.shape[-2:]).sum(-3)


def _weights(q, k, mask, lse, scale: float, causal: bool):
    """softmax(q k^T * scale + mask) rebuilt from the log-sum-exp (0 where a row has no key);
    a boolean mask keeps where true, a float one is added, as SDPA's."""
    s = (q.to(_acc(q)) @ k.to(_acc(q)).transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(s.dtype)
    if causal:
        lq, lk = s.shape[-2:]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = lse.masked_fill(lse == float("-inf"), 0.0)
    return s, torch.exp(s - lse.unsqueeze(-1))


@torch.library.custom_op("strata::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(q k^T * scale + mask [causal]) @ v, logsumexp of each query's scores in float32,
    or float64 for float64 inputs). k and v may have fewer heads than q (GQA); the mask takes no
    gradient (training.py keeps a float mask that requires one on SDPA's own path)."""
    k, v = _shared(k, q), _shared(v, q)
    s, _ = _weights(q, k, mask, q.new_zeros(q.shape[:-1], dtype=_acc(q)), scale, causal)
    lse = torch.logsumexp(s, -1)
    _, p = _weights(q, k, mask, lse, scale, causal)
    return (p @ v.to(p.dtype)).to(q.dtype), lse


@attention.register_fake
def _(q, k, v, mask, scale, causal):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=_acc(q))


@torch.library.custom_op("strata::attention_backward", mutates_args=())
def attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor,
                       scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): with p the weights, dv = p^T g, ds = p * (g v^T - rowsum(g * out)) * scale,
    dq = ds k, dk = ds^T q."""
    k_, v_ = _shared(k, q), _shared(v, q)
    _, p = _weights(q, k_, mask, lse, scale, causal)
    f = lambda t: t.to(p.dtype)
    g = f(grad)
    ds = p * (g @ f(v_).transpose(-1, -2) - (g * f(out)).sum(-1, keepdim=True)) * scale
    return ((ds @ f(k_)).to(q.dtype), _folded(ds.transpose(-1, -2) @ f(q), k).to(k.dtype),
            _folded(p.transpose(-1, -2) @ g, v).to(v.dtype))


@attention_backward.register_fake
def _(grad, q, k, v, mask, out, lse, scale, causal):
    # contiguous, as the eager body's are (empty_like would copy strides a later view relies on)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, mask, scale, causal = inputs
    ctx.save_for_backward(q, k, v, mask, *output)
    ctx.scale, ctx.causal = scale, causal


def _backward(ctx, grad, _grad_lse):
    q, k, v, mask, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad, q, k, v, mask, out, lse, ctx.scale, ctx.causal)
    return dq, dk, dv, None, None, None


attention.register_autograd(_backward, setup_context=_setup)
