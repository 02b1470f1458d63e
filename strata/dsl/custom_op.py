"""st.custom_op: a @strata.kernel as a torch operator that compiled programs keep as a kernel.

    rms = st.custom_op("mylib::rmsnorm", rmsnorm, grid=lambda x, w, eps: x.shape[0], block=32,
                       out_shape=lambda x, w, eps: x.shape)
    y = rms(x, w, 1e-6)                                # eager: launches the kernel
    strata.compile(lambda x: rms(x, w, 1e-6) * 2, (x,))   # the kernel is one of the program's

Why a real torch.library op: torch.export captures it as one node (its fake implementation gives
the output's shape), eager and torch.compile call it like any op, and strata's decomposition
turns the node into a Tensor IR `Custom` node that every stage carries whole: fusion makes its
operands buffers, and kernel lowering asks this module for the Kernel IR on those buffers (its
scalar arguments compiled in as constants). The op's arguments are the kernel's parameters but
the output (`out=`, default "out") and the constexprs (`constexprs={...}`), in order: a
parameter annotated int, float or bool is a scalar, any other a tensor.
"""
from __future__ import annotations

import numpy as np
import torch

from ..core import dtypes
from ..core.errors import InputMismatch, StrataError
from ..kernel_ir.verify import verify_kernel
from ..tensor.ir import CUSTOM_OPS
from .frontend import Spec, build
from .kernel import KernelFunction, _dims
from .lang import constexpr

_SCHEMA = {int: "int", float: "float", bool: "bool"}
_LIBRARIES: dict = {}             # namespace -> torch.library.Library (kept alive)


def custom_op(name: str, kernel: KernelFunction, *, grid, block, out_shape, out_dtype=None,
              out: str = "out", constexprs: dict | None = None, backward=None):
    """Register `kernel` as the torch operator `name` ("namespace::op"); returns the op.

    backward(grad, *args) -> one gradient per argument of the op (None for a scalar or one that
    needs none): torch ops, other custom ops included. It is the op's autograd formula, eagerly
    and under torch.compile(backend="strata"), which compiles it into the backward program."""
    if not isinstance(kernel, KernelFunction):
        raise StrataError("st.custom_op takes a @strata.kernel function")
    if "::" not in name:
        raise StrataError(f"an op name is 'namespace::name', not {name!r}")
    ns, op = name.split("::", 1)
    spec = CustomKernel(kernel, grid, block, out_shape, out_dtype, out, dict(constexprs or {}))
    schema = ", ".join(f"{_SCHEMA.get(p.annotation, 'Tensor')} {p.name}" for p in spec.args)
    lib = _LIBRARIES.setdefault(ns, torch.library.Library(ns, "FRAGMENT"))
    lib.define(f"{op}({schema}) -> Tensor")
    lib.impl(op, spec.eager, "CompositeExplicitAutograd")
    torch.library.register_fake(name, lib=lib)(spec.fake)
    CUSTOM_OPS[f"{ns}.{op}.default"] = spec
    if backward is not None:
        _register_backward(name, lib, len(spec.args), backward)
    return getattr(getattr(torch.ops, ns), op)


def _register_backward(name: str, lib, n_args: int, backward) -> None:
    """The op's autograd formula: its tensor arguments saved, backward(grad, *args) called."""
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*(a for a in inputs if isinstance(a, torch.Tensor)))
        ctx.scalars = {i: a for i, a in enumerate(inputs) if not isinstance(a, torch.Tensor)}

    def formula(ctx, grad):
        saved = iter(ctx.saved_tensors)
        args = [ctx.scalars[i] if i in ctx.scalars else next(saved) for i in range(n_args)]
        grads = backward(grad, *args)
        grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
        if len(grads) != n_args:
            raise StrataError(f"the backward of {name} returned {len(grads)} gradients; the op "
                              f"takes {n_args} arguments (give None for a scalar)")
        return grads
    torch.library.register_autograd(name, formula, setup_context=setup_context, lib=lib)


class CustomKernel:
    """What the stages ask of a custom op (tensor/ir.py's Custom.kernel)."""

    def __init__(self, fn, grid, block, out_shape, out_dtype, out, constexprs):
        self.fn, self.grid, self.block, self.out_shape = fn, grid, block, out_shape
        self.out_dtype, self.out, self.constexprs = out_dtype, out, constexprs
        params = list(fn.signature.parameters.values())
        if out not in fn.signature.parameters:
            raise StrataError(f"{fn.__name__} has no parameter {out!r} for the output (out=)")
        self.args = [p for p in params if p.name != out and p.name not in constexprs
                     and p.annotation is not constexpr]

    def _out(self, args, device):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        dtype = self.out_dtype or (tensors[0].dtype if tensors else torch.float32)
        return torch.empty(tuple(self.out_shape(*args)), dtype=dtype, device=device)

    def fake(self, *args):
        return self._out(args, next((a.device for a in args if isinstance(a, torch.Tensor)),
                                    "cpu"))

    def eager(self, *args):
        result = self._out(args, "cpu")
        kwargs = {p.name: a for p, a in zip(self.args, args)}
        kwargs = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        self.fn[self.grid(*args), self.block](**kwargs, **{self.out: result}, **self.constexprs)
        return result

    def reference(self, args, dtype: str, precision: str) -> np.ndarray:
        """The op run eagerly on the CPU (float64 in, float64 out when precision is f64)."""
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
                   for a in args]
        out = self.eager(*tensors)
        out = out.double() if out.is_floating_point() else out
        return out.numpy()

    def kernel_ir(self, name: str, args: tuple, out_buf: str, buffers: dict):
        """The kernel on a compiled program's buffers (scalars compiled in), named `name`."""
        kinds, names, meta = {}, {}, []
        for p, a in zip(self.args, args):
            if isinstance(a, str):
                dtype, shape = buffers[a]
                kinds[p.name], names[p.name] = ("tensor", dtype, shape), a
                meta.append(torch.empty(shape, dtype=dtypes.to_torch(dtype), device="meta"))
            else:
                kinds[p.name] = ("const", a)
                meta.append(a)
        dtype, shape = buffers[out_buf]
        kinds[self.out], names[self.out] = ("tensor", dtype, shape), out_buf
        for k, v in self.constexprs.items():
            kinds[k] = ("const", v)
        if len(set(names.values())) < len(names):
            raise InputMismatch(f"{self.fn.__name__}: one tensor passed as two of its arguments")
        grid = _dims(self.grid(*meta), "grid")
        block = _dims(self.block(*meta) if callable(self.block) else self.block, "block")
        k = build(self.fn.fn, Spec(kinds, grid, block, names), name)
        verify_kernel(k, gpu=True)
        return k
