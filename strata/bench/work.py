"""The ideal work of a program: bytes that must move and FLOPs that must run.

GB/s, TFLOP/s and "% of ceiling" are only as honest as these numbers, so they are the minimum
any implementation needs: every input, weight and output moved once (intermediates are free:
fusing them away is the point), and the FLOPs of matmul-like ops as torch's FlopCounterMode
counts them (mm, addmm, bmm, baddbmm, convolution, attention; elementwise ops count as 0).
A caller that knows better (causal attention does half the products) passes explicit numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Work:
    bytes: int
    flops: int


def _tensors(values) -> list[torch.Tensor]:
    flat, _ = torch.utils._pytree.tree_flatten(values)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape)) if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def weights_of(fn) -> list[torch.Tensor]:
    if isinstance(fn, torch.nn.Module):
        return list(fn.parameters()) + list(fn.buffers())
    return []


def count_flops(fn, inputs) -> int:
    """FLOPs of `fn(*inputs)` by torch's FlopCounterMode (runs fn once; meta tensors work)."""
    from torch.utils.flop_counter import FlopCounterMode
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn(*inputs)
    return int(counter.get_total_flops())


def estimate_work(fn, inputs, outputs=None, bytes: int | None = None,
                  flops: int | None = None) -> Work:
    """Bytes: inputs + weights (parameters and buffers of a module) + outputs, each once.
    FLOPs: FlopCounterMode's count. Explicit `bytes` / `flops` win; `outputs` saves a run."""
    if bytes is None:
        if outputs is None:
            with torch.no_grad():
                outputs = fn(*inputs)
        bytes = _nbytes(_tensors(inputs) + weights_of(fn)) + _nbytes(_tensors(outputs))
    if flops is None:
        flops = count_flops(fn, inputs)
    return Work(int(bytes), int(flops))
