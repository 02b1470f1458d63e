"""What a strata program does where autograd is on: strata compiles forward programs only (no
backward yet), and says so instead of returning outputs without history that fail later with
PyTorch's "element 0 of tensors does not require grad and does not have a grad_fn".

Compiling where autograd is on, with parameters or inputs that require grad, warns in one
sentence. A call made so returns outputs whose backward raises NoBackward, in one sentence: a
refusal at the call would break inference run without torch.no_grad() (parameters require grad
by default), and outputs without history would let a loss mixing them with eager results skip
their gradients silently. Used by strata.compile (api/__init__.py); the torch.compile backend compiles
the backward too (torch_compile/backend.py).
"""
from __future__ import annotations

import warnings

import torch
from torch.utils import _pytree as pytree

from ..core.errors import StrataError

HOW = ("run it under torch.no_grad() or torch.inference_mode(), or train with the eager module or "
       "torch.compile(model, backend='strata'), which compiles the backward too")


class StrataNoGradWarning(UserWarning):
    """A program compiled where autograd is on: it computes no gradients."""


class NoBackward(StrataError):
    """A backward through the outputs of a strata program."""


def warn_inference_only(what: str, tensors, stacklevel: int = 3) -> None:
    """The compile-time sentence, when autograd is on and one of `tensors` requires grad."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in tensors):
        warnings.warn(f"{what} is inference only (strata compiles no backward yet): its outputs "
                      f"cannot be backpropagated through; {HOW}", StrataNoGradWarning,
                      stacklevel=stacklevel)


class _Raise(torch.autograd.Function):
    """Passes an output through; its backward raises NoBackward."""

    @staticmethod
    def forward(ctx, out, *sources):
        return out

    @staticmethod
    def backward(ctx, *grads):
        raise NoBackward(f"a strata program's outputs cannot be backpropagated through (strata "
                         f"compiles no backward yet): {HOW}")


def without_backward(outputs, params, inputs):
    """`outputs` (any structure of tensors) of a call made where autograd is on: each float output
    that is not an input returned as it is hangs on every tensor of `params` and `inputs` that
    requires grad, through a node whose backward raises; as they are when none requires grad."""
    sources = [t for t in (*params, *inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not sources:
        return outputs
    given = {id(x) for x in inputs}
    return pytree.tree_map_only(torch.Tensor, lambda t: t if id(t) in given or not t.is_floating_point()
                                else _Raise.apply(t, *sources), outputs)
