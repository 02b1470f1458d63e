"""Call-time arguments: check them against what the program was compiled for, then make each one
a tensor a kernel can read through a bare pointer.

Why a module of its own: the checks are the user's side of the runtime (wrong shape, dtype,
device: one sentence naming the argument, InputMismatch), they are shared by the simulator path
and the CUDA path, and they are testable on a CPU with CPU tensors. Kernels index buffers as flat
row-major arrays and may use 16-byte vector accesses, so a non-contiguous tensor, or a contiguous
view whose data pointer is not 16-byte aligned, is copied (the only copies the runtime makes).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..core import dtypes
from ..core.errors import InputMismatch

POINTER_ALIGN = 16          # the widest vector access a kernel makes, in bytes


def _device_matches(actual: torch.device, wanted: torch.device) -> bool:
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)


def check_args(spec: Mapping, values: Sequence, device: torch.device | str | None = None,
               role: str = "input") -> None:
    """Raise InputMismatch, naming the argument, unless `values` match `spec` (name -> an object
    with .shape and .dtype, e.g. TorchType or Buffer) in count, type, shape, dtype and, when
    `device` is given, device. `role`: what the message calls them (input, out=)."""
    if len(values) != len(spec):
        raise InputMismatch(f"expected {len(spec)} {role}s ({', '.join(spec)}), got {len(values)}")
    wanted = torch.device(device) if device is not None else None
    for (name, ty), value in zip(spec.items(), values):
        if not isinstance(value, torch.Tensor):
            raise InputMismatch(f"{role} {name!r} must be a tensor, got {type(value).__name__}")
        if tuple(value.shape) != tuple(ty.shape):
            raise InputMismatch(f"{role} {name!r} has shape {tuple(value.shape)}, but the program "
                                f"was compiled for {tuple(ty.shape)}")
        if value.dtype != (want := dtypes.to_torch(ty.dtype)):
            have, want = (str(d).removeprefix("torch.") for d in (value.dtype, want))
            raise InputMismatch(f"{role} {name!r} is {have}, but the program was compiled for "
                                f"{want} ({name}.to(torch.{want}) converts it)")
        if wanted is not None and not _device_matches(value.device, wanted):
            raise InputMismatch(f"{role} {name!r} is on {value.device} but the program runs on "
                                f"{wanted}; move it there first ({name}.to('{wanted}'))")


def as_kernel_arg(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when a kernel can read it through data_ptr(), else a contiguous aligned copy."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() and t.data_ptr() % POINTER_ALIGN:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def prepare_args(spec: Mapping, values: Sequence, device: torch.device | str | None = None
                 ) -> list[torch.Tensor]:
    """check_args, then one kernel-ready tensor per argument, in spec order (no copy unless the
    argument is non-contiguous or misaligned)."""
    check_args(spec, values, device)
    return [as_kernel_arg(v) for v in values]


def prepare_weights(buffers: Sequence, weights: Mapping[str, torch.Tensor],
                    device: torch.device | str) -> dict[str, torch.Tensor]:
    """The program's weight buffers as kernel-ready tensors on `device`, uploaded once."""
    out = {}
    for b in buffers:
        if b.kind != "weight":
            continue
        w = weights.get(b.name)
        if w is None:
            raise InputMismatch(f"weight {b.name} ({b.dtype}{list(b.shape)}) was not given")
        if tuple(w.shape) != tuple(b.shape) or dtypes.from_torch(w.dtype) != b.dtype:
            raise InputMismatch(f"weight {b.name} has shape {tuple(w.shape)} "
                                f"{dtypes.from_torch(w.dtype)}, the program was compiled for "
                                f"{tuple(b.shape)} {b.dtype}")
        out[b.name] = as_kernel_arg(w.detach().to(device))
    return out
