"""Weights asked of L2 before a kernel waits for the one before it (sm_90, programmatic launch).

Why: a decode step is a chain of about a hundred kernels, most of them matrix-vector products
that read a weight once. Under programmatic dependent launch the next kernel's blocks become
resident while the one before it drains, but each waits (griddepcontrol.wait) before its first
load, so the weights of kernel n + 1 start streaming only once kernel n has ended, and the tail
of every kernel leaves the memory half idle. No kernel of a program writes its weights, so a
block may ask for them before that wait: each block prefetches its share of each weight the
kernel reads (one cp.async.bulk.prefetch.L2 per weight, issued by one thread), at most
L2_PREFETCH KiB per kernel (default: an eighth of L2, since the kernel before it still has its
own bytes in flight there). A weight under SMALL bytes (a norm's) is left alone: every block reads
all of it, so it is in L2 after the first. The statements head the kernel's body; the CUDA emitter
puts the grid dependency after them. Tensor-map operands (TMA) are not prefetched here.
"""
from __future__ import annotations

from dataclasses import replace

from ..core import dtypes
from ..core.expr import Const, mul
from .ir import BlockIdx, KernelProgram, PrefetchL2

KIB = 1024
ALIGN = 16              # cp.async.bulk: address and size in multiples of 16 bytes
SMALL = 64 * KIB


def default_kib(arch) -> int:
    return dict(arch.caches).get("L2", 0) // 8 // KIB


def prefetch_weights(kp: KernelProgram, ctx) -> KernelProgram:
    """`kp` with PrefetchL2 statements heading each kernel that reads weights, on CUDA targets
    with bulk copies (sm_90+); unchanged elsewhere or with L2_PREFETCH=0."""
    arch = ctx.arch
    if not (arch.is_gpu and arch.language == "cuda" and arch.has("tma")):
        return kp
    cap = ctx.knob("L2_PREFETCH", default_kib(arch)) * KIB
    if cap <= 0:
        return kp
    kind = {b.name: b.kind for b in kp.buffers}
    written = {p.name for k in kp.kernels for p in k.params if p.output}
    kernels = []
    for k in kp.kernels:
        weights = [p for p in k.params if kind.get(p.name) == "weight" and p.name not in written
                   and p.tensor_map is None and p.numel * dtypes.ITEMSIZE[p.dtype] >= SMALL]
        total = sum(p.numel * dtypes.ITEMSIZE[p.dtype] for p in weights)
        head = []
        for p in weights:
            size = dtypes.ITEMSIZE[p.dtype]
            share = p.numel * size // k.grid // ALIGN * ALIGN     # every block's inside the buffer
            take = min(share, share * cap // total // ALIGN * ALIGN)
            if take:
                head.append(PrefetchL2(p.name, mul(BlockIdx(), Const(share // size)), take))
        kernels.append(replace(k, body=(*head, *k.body)) if head else k)
    return replace(kp, kernels=kernels)


def leading(body) -> int:
    """How many statements head `body` as prefetches run before the grid dependency."""
    n = 0
    while n < len(body) and isinstance(body[n], PrefetchL2):
        n += 1
    return n
