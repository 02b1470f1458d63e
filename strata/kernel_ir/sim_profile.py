"""What a GPU profiler would say about a schedule's memory accesses, counted by the simulator:
GPU evidence on a machine without a GPU.

Per kernel and per warp request (one load or store statement run by a warp's active lanes):
  - global memory: the 32-byte sectors the request touches against the fewest its bytes could
    fill (a fully coalesced request touches exactly those);
  - shared memory: wavefronts, the most distinct 4-byte words any of the 32 banks serves in the
    request (two lanes reading one word share it), against the fewest its words need: more is a
    bank conflict;
  - bytes moved through global memory against the kernel's minimum (every parameter it reads
    read once, every one it writes written once);
  - statements issued per warp, by kind; scalar operations per lane, tensor-core flops.
Counted for plain and vector loads and stores; the traffic of ldmatrix, cp.async, TMA and wgmma
(sim_mma.py, sim_async.py, sim_tma.py, sim_wgmma.py) is not. Counting runs only inside
`with profiling() as kernels:`, which collects {kernel name: KernelProfile} of every launch.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..core import dtypes

SECTOR, BANKS, WORD = 32, 32, 4
ACTIVE: dict | None = None          # the collecting dict while profiling, else None


@dataclass
class Access:
    requests: int = 0
    actual: int = 0         # sectors (global) or wavefronts (shared)
    ideal: int = 0          # the fewest those requests could take
    bytes: int = 0

    @property
    def ratio(self) -> float:
        return self.actual / self.ideal if self.ideal else 1.0


@dataclass
class KernelProfile:
    name: str
    minimum_read: int = 0               # bytes: each read parameter once
    minimum_written: int = 0
    accesses: dict = field(default_factory=lambda: {k: Access() for k in (
        "global load", "global store", "shared load", "shared store")})
    issued: Counter = field(default_factory=Counter)     # statement kind -> warp issues
    lane_ops: int = 0           # scalar statements (Let, Assign) times the lanes running them
    tensor_flops: int = 0       # mma and wgmma multiply-adds, times two

    def issue(self, s, lanes: int, warps: int) -> None:
        """A statement run by `lanes` lanes of `warps` warps."""
        kind = type(s).__name__
        self.issued[kind] += warps
        if kind in ("Let", "Assign"):
            self.lane_ops += lanes
        elif kind == "Mma":                     # m16n8k16 per warp
            self.tensor_flops += warps * 2 * 16 * 8 * 16
        elif kind == "Wgmma":                   # m64nNk16 per warpgroup: a quarter per warp
            self.tensor_flops += warps * 2 * 16 * s.n * 16

    def global_request(self, kind: str, warps: np.ndarray, start: np.ndarray, nbytes: int):
        a = self.accesses[f"global {kind}"]
        first, last = start // SECTOR, (start + nbytes - 1) // SECTOR
        keys = np.unique(np.concatenate([warps << 40 | first, warps << 40 | last]))
        lanes = np.bincount(warps)
        lanes = lanes[lanes > 0]
        a.requests += len(lanes)
        a.actual += len(keys)
        a.ideal += int(np.sum(-(-lanes * nbytes // SECTOR)))
        a.bytes += len(warps) * nbytes

    def shared_request(self, kind: str, warps: np.ndarray, start: np.ndarray, nbytes: int):
        a = self.accesses[f"shared {kind}"]
        words = [start // WORD + k for k in range(max(1, nbytes // WORD))]
        pairs = np.unique(np.concatenate([warps << 32 | w for w in words]))
        warp, word = pairs >> 32, pairs & 0xFFFFFFFF
        banks, per_bank = np.unique(warp << 5 | word % BANKS, return_counts=True)
        worst = np.zeros(int(warp.max()) + 1, dtype=np.int64)
        np.maximum.at(worst, banks >> 5, per_bank)
        distinct = np.bincount(warp)
        used = distinct > 0
        a.requests += int(used.sum())
        a.actual += int(worst[used].sum())
        a.ideal += int(np.sum(-(-distinct[used] // BANKS)))
        a.bytes += len(warps) * nbytes


def start(kernel) -> KernelProfile | None:
    """The profile a launch of `kernel` adds to, when profiling (several launches of one kernel
    add up)."""
    if ACTIVE is None:
        return None
    prof = ACTIVE.get(kernel.name)
    if prof is None:
        prof = ACTIVE[kernel.name] = KernelProfile(kernel.name)
    for p in kernel.params:
        size = p.numel * dtypes.ITEMSIZE[p.dtype]
        if p.output:
            prof.minimum_written += size
        else:
            prof.minimum_read += size
    return prof


def itemsize(dtype: str) -> int:
    return dtypes.ITEMSIZE[dtype]


@contextmanager
def profiling():
    """Collect {kernel name: KernelProfile} of every kernel the simulator runs inside."""
    global ACTIVE
    outer, ACTIVE = ACTIVE, {}
    try:
        yield ACTIVE
    finally:
        ACTIVE = outer
