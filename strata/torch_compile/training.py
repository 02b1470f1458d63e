"""Training through `torch.compile(model, backend="strata")` (torch_compile/backend.py): AOTAutograd
splits a graph traced with autograd on into a forward graph, whose outputs include the
activations the backward saves, and a backward graph; strata compiles each as it compiles an
inference graph, both at compile time, so an op either lacks is named before any step. The
optimizer step runs eagerly, as the user wrote it, unless compiled too:
`torch.compile(opt.step, backend="strata")` (AdamW, Adam, SGD with momentum; foreach or not) is
a graph without autograd, whose parameters and state dynamo holds as its graph's attributes;
strata reads them as inputs its program updates in place (backend._capture).

The split is Inductor's (min-cut rematerialization): what is cheap to recompute from saved
inputs (a transposed weight, elementwise ops) is recomputed in the backward, where strata fuses
it into the kernels that read it, rather than written out by the forward and read back. With
AOTAutograd's default split the forward stored `t(W)` of every linear; a TinyLlama-shaped MLP
step (128 tokens, f32, Zen 4) ran 342 tokens/s so and 372 with this one, a decoder block 167 and
207, interleaved in one run.

For a GPU (or the simulator), an SDPA call (dynamo's own, or the one nn.MultiheadAttention
makes) becomes `strata::attention` where it can (flash_sdpa: no dropout, no mask that takes a
gradient; torch_compile/attention_op.py): the forward saves each query's
log-sum-exp rather than the Lq x Lk weights, and its backward is one `attention_backward` that
the GPU pipeline fuses into flash kernels. What else the backward needs beyond AOTAutograd's
core ATen decompositions is here: SDPA traced as its math elsewhere (the fused CPU kernel's
backward op has no strata rule), convolution's backward as
convolutions (torch has no decomposition of it for the CPU) and max pooling's as an
accumulating index_put.
"""
from __future__ import annotations

import contextlib
import math

import torch

from . import attention_op  # noqa: F401  (registers strata::attention)

aten = torch.ops.aten


def training(example_inputs) -> bool:
    """Whether dynamo's graph is traced for a backward: autograd on, and an input (a parameter,
    usually) that requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs)


def forward_and_backward(gm, example_inputs, compile_graph, flash: bool = False):
    """AOTAutograd over `gm`; compile_graph(graph, inputs) -> a callable of the graph's inputs
    compiles each of the two graphs, here from zeros of the traced shapes (AOTAutograd traces
    with fake tensors). Every input is an input, parameters too: they change at every step.
    `flash`: SDPA calls become strata::attention where they can (a GPU target)."""
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as functorch_config
    from torch._functorch._aot_autograd.utils import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def compile_now(g, inputs):
        with unset_fake_temporarily():
            zeros = [torch.zeros(a.shape, dtype=a.dtype, device=a.device)
                     if isinstance(a, torch.Tensor) else a for a in inputs]
            return make_boxed_func(compile_graph(g, zeros))
    table = {**core_aten_decompositions(), aten.convolution_backward.default: convolution_backward,
             aten.max_pool2d_with_indices_backward.default: max_pool_backward}
    # SDPA that flash_sdpa does not take traced as its math (F.multi_head_attention_forward's
    # call too); the backward compiled now, not at the first backward
    with sdpa_kernel(SDPBackend.MATH), flash_attention(gm) if flash else contextlib.nullcontext(), \
            functorch_config.patch(force_non_lazy_backward_lowering=True):
        return aot_autograd(fw_compiler=compile_now, bw_compiler=compile_now,
                            decompositions=table,
                            partition_fn=min_cut_rematerialization_partition)(gm, example_inputs)


SDPA = torch._C._nn.scaled_dot_product_attention


def flash_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    """SDPA as strata::attention's output where it can be (no dropout; a mask, as transformers
    passes one, unless it is a float mask that requires grad; GQA's KV heads shared as
    enable_gqa says), else SDPA itself (traced as its math). Decided while AOTAutograd traces,
    on the traced tensors."""
    q, k = query, key
    if dropout_p or q.dim() < 2 or not q.dim() == k.dim() == value.dim() or (
            attn_mask is not None and attn_mask.requires_grad) or (
            q.dim() >= 3 and q.shape[-3] != k.shape[-3]
            and not (enable_gqa and q.shape[-3] % k.shape[-3] == 0)):
        return SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                    is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return torch.ops.strata.attention(query, key, value, attn_mask, scale, bool(is_causal))[0]


@contextlib.contextmanager
def flash_attention(gm):
    """While AOTAutograd traces `gm`: its SDPA calls are flash_sdpa's, and so are those that
    torch functions it calls make (F.multi_head_attention_forward, nn.MultiheadAttention's:
    dynamo keeps that call whole, and it looks SDPA up in torch.nn.functional)."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is SDPA:
            n.target = flash_sdpa
    gm.recompile()
    functional = torch.nn.functional
    real, functional.scaled_dot_product_attention = functional.scaled_dot_product_attention, flash_sdpa
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = real


def convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    """(grad_input, grad_weight, grad_bias) of a convolution as convolutions: the input's is
    the transposed convolution of grad by w (an output padding restores the input's size); the
    weight's, per group, is x convolved with grad as the kernel (batch and channels swapped;
    stride and dilation trade places), cut to the kernel's size. A transposed convolution's
    weight gradient is left to torch's op (strata names it unsupported)."""
    if transposed and output_mask[1]:
        return NotImplemented
    n = x.dim() - 2
    k = w.shape[2:]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if transposed:
            grad_input = aten.convolution(grad, w, None, stride, padding, dilation, False,
                                          [0] * n, groups)
        else:
            extra = [x.shape[2 + i] + 2 * padding[i] - dilation[i] * (k[i] - 1) - 1
                     - (grad.shape[2 + i] - 1) * stride[i] for i in range(n)]
            grad_input = aten.convolution(grad, w, None, stride, padding, dilation, True,
                                          extra, groups)
    if output_mask[1]:
        per_in, per_out = x.shape[1] // groups, grad.shape[1] // groups
        parts = []
        for g in range(groups):
            xg = x[:, g * per_in:(g + 1) * per_in].transpose(0, 1)
            dg = grad[:, g * per_out:(g + 1) * per_out].transpose(0, 1)
            wg = aten.convolution(xg, dg, None, dilation, padding, stride, False, [0] * n, 1)
            parts.append(wg.transpose(0, 1)[(..., *(slice(0, k[i]) for i in range(n)))])
        grad_weight = parts[0] if groups == 1 else torch.cat(parts, 0)
    if output_mask[2]:
        grad_bias = grad.sum([0, *range(2, grad.dim())])
    return grad_input, grad_weight, grad_bias


def max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each window's gradient added at its maximum's position: `indices` (flat within a channel's
    plane) offset by the plane's start, one accumulating index_put over all planes."""
    area = x.shape[-2] * x.shape[-1]
    planes = x.numel() // area
    start = torch.arange(planes, device=x.device).mul(area).view(*x.shape[:-2], 1, 1)
    flat = torch.zeros(planes * area, dtype=grad.dtype, device=grad.device)
    flat = flat.index_put(((indices + start).reshape(-1),), grad.reshape(-1), accumulate=True)
    return flat.view(x.shape)
