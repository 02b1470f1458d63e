"""TMA (cp.async.bulk.tensor) and mbarrier in the simulator: phases, transaction bytes, and the
moment a thread may see what a TMA copy brought.

Shared arrays get simulated byte addresses (`smem_bases`: declaration order, each 1024-byte
aligned, as the CUDA emitter aligns the arrays TMA and wgmma touch), so swizzles, which the
hardware computes from address bits, act on the same bits here.

mbarrier (per block, one per element of an i64 shared array), as in the PTX ISA: init sets phase
0 expecting `count` arrivals; an arrive takes one arrival and expect_tx adds transaction bytes; a
TMA copy completes its box's bytes; when no arrival is pending and the byte count is zero the
phase completes: the completed-phase count goes up by one (so the parity flips) and the arrivals
are re-armed. try_wait.parity P is true once the phase of parity P has completed, that is when
the current phase's parity is not P.

A TMA copy reads global memory and writes its box into shared memory when issued (swizzled,
out-of-bounds elements zero), but the data belongs to the barrier phase it completes on: a thread
may read (or overwrite) it only after its own successful wait on that barrier has seen the phase
complete ("missing mbarrier wait" otherwise), which is what orders it on the GPU. The TMA write
itself is checked like a write by the issuing thread against other threads' accesses since the
last Sync, and against wgmma still reading the elements.

Shared memory written by an ordinary store or cp.async (the generic proxy) may be read by wgmma
(the async proxy) only after its writer's fence.proxy.async (FenceProxyAsync), as PTX's memory
model asks; TMA writes are the async proxy's own ("missing fence.proxy.async" otherwise).

The simulator runs threads in lock step, so a blocking wait (MbarWait) on a phase that has not
completed when the thread reaches it is a SimError: on the GPU it would hang, or it waits for a
producer that runs later in program order, which this simulator cannot schedule. Threads other
than the one that ran mbarrier.init may use the barrier only after a Sync. Ordering between
threads by mbarrier arrive/wait alone (without Sync) is not modelled for ordinary stores: the
race rules of sim.py still ask for a Sync there.
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes
from .ir import (
    SWIZZLE_BYTES,
    FenceProxyAsync,
    MbarArrive,
    MbarInit,
    MbarTryWait,
    MbarWait,
    TmaLoad,
)
from .sim_memory import compute_numpy, to_storage

SMEM_ALIGN = 1024
TMA_STMTS = (MbarInit, MbarArrive, MbarTryWait, MbarWait, TmaLoad, FenceProxyAsync)


def smem_bases(smem_decls) -> dict[str, int]:
    """Simulated byte address of each shared array (declaration order, 1024-byte aligned)."""
    out, at = {}, 0
    for name, d in smem_decls.items():
        out[name] = at
        size = d.size * dtypes.ITEMSIZE[d.dtype]
        at += -(-size // SMEM_ALIGN) * SMEM_ALIGN
    return out


def swizzle(addr: np.ndarray, mode: str) -> np.ndarray:
    """Byte address -> where the swizzle `mode` puts it: the 16-byte chunk index (bits 4..) is
    XORed with the 128-byte row index within its group of 8 (bits 7..), on log2(S / 16) bits."""
    s = SWIZZLE_BYTES[mode]
    if not s:
        return addr
    return addr ^ (((addr >> 7) & (s // 16 - 1)) << 4)


def box_offsets(tm) -> tuple[np.ndarray, np.ndarray]:
    """(E, rank) coordinates of the box's elements in the order TMA lays them out in shared
    memory (innermost dimension fastest), and their logical byte offsets' element index (0..E)."""
    e = np.arange(tm.box_elems, dtype=np.int64)
    coords, step = [], 1
    for b in tm.box:
        coords.append((e // step) % b)
        step *= b
    return np.stack(coords, axis=1), e


class TmaState:
    """The mbarriers and TMA copies of one batch of blocks."""

    def __init__(self, batch):
        self.batch = batch
        self.bases = smem_bases(batch.launch.smem_decls)
        self.slot0: dict[str, int] = {}     # barrier array -> first slot
        nslots = 0
        for name, d in batch.launch.smem_decls.items():
            if d.dtype == "i64":
                self.slot0[name] = nslots
                nslots += d.size
        shape = (batch.nb, max(nslots, 1))
        self.init = np.zeros(shape, dtype=bool)
        self.count = np.zeros(shape, dtype=np.int64)
        self.pending = np.zeros(shape, dtype=np.int64)
        self.tx = np.zeros(shape, dtype=np.int64)
        self.phase = np.zeros(shape, dtype=np.int64)       # completed phases
        self.init_tid = np.full(shape, -1, dtype=np.int64)
        self.init_epoch = np.full(shape, -1, dtype=np.int64)
        self.observed = np.zeros((batch.n, shape[1]), dtype=np.int64)   # per lane

    # ------------------------------------------------------------ barriers

    def slots(self, bar: str, index_expr, idx, what: str, need_init: bool = True):
        """(lanes, block, slot) of bar[index] for the active lanes, checked."""
        b = self.batch
        sh = b.smem.get(bar)
        if sh is None or bar not in self.slot0:
            b.launch.fail(f"{what} on {bar}, which is not a shared i64 array")
        lanes = b.lanes(idx)
        index = b.ints(b.eval(index_expr, idx), idx)
        b.check_bounds(bar, index, sh.decl.size, idx, f"{what} of")
        blk, slot = b.local[lanes], self.slot0[bar] + index
        if need_init:
            bad = ~self.init[blk, slot]
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                b.launch.fail(f"{what} on {bar}[{index[j]}] before mbarrier.init, by "
                              f"{b.who(lanes[j])}")
            bad = (self.init_tid[blk, slot] != b.tid[lanes]) & \
                (self.init_epoch[blk, slot] == b.epoch[blk])
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                b.launch.fail(f"{what} on {bar}[{index[j]}] by {b.who(lanes[j])}, which thread "
                              f"{self.init_tid[blk[j], slot[j]]} initialised since the last "
                              f"barrier (missing Sync after mbarrier.init)")
        return lanes, blk, slot, index

    def complete(self, blk, slot, bar: str, index) -> None:
        """Complete the phase of every touched barrier with no arrival and no byte pending."""
        b = self.batch
        bad = self.pending[blk, slot] < 0
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            b.launch.fail(f"mbarrier {bar}[{index[j]}] got more arrivals than its count "
                          f"{self.count[blk[j], slot[j]]} in one phase")
        done = (self.pending[blk, slot] == 0) & (self.tx[blk, slot] == 0)
        if done.any():
            key = np.unique(np.stack([blk[done], slot[done]], axis=1), axis=0)
            kb, ks = key[:, 0], key[:, 1]
            self.phase[kb, ks] += 1
            self.pending[kb, ks] = self.count[kb, ks]

    def mbar_init(self, s: MbarInit, idx) -> None:
        b = self.batch
        lanes, blk, slot, _ = self.slots(s.bar, s.index, idx, "mbarrier.init", need_init=False)
        key = blk * self.init.shape[1] + slot
        if len(np.unique(key)) != len(key):
            b.launch.fail(f"two threads initialise mbarrier {s.bar} at once")
        self.init[blk, slot] = True
        self.count[blk, slot] = self.pending[blk, slot] = s.count
        self.tx[blk, slot] = 0
        self.phase[blk, slot] = 0
        self.init_tid[blk, slot] = b.tid[lanes]
        self.init_epoch[blk, slot] = b.epoch[blk]
        for bk, sl in zip(blk, slot):       # a fresh barrier: nobody has seen a phase of it
            self.observed[b.local == bk, sl] = 0

    def mbar_arrive(self, s: MbarArrive, idx) -> None:
        _, blk, slot, index = self.slots(s.bar, s.index, idx, "mbarrier.arrive")
        np.add.at(self.pending, (blk, slot), -1)
        if s.tx_bytes:
            np.add.at(self.tx, (blk, slot), s.tx_bytes)
        self.complete(blk, slot, s.bar, index)

    def mbar_wait(self, s, idx) -> None:
        b = self.batch
        what = "mbarrier.try_wait.parity"
        lanes, blk, slot, index = self.slots(s.bar, s.index, idx, what)
        parity = b.ints(b.eval(s.parity, idx), idx) & 1
        completed = self.phase[blk, slot]
        ok = (completed & 1) != parity
        if isinstance(s, MbarWait) and not ok.all():
            j = int(np.flatnonzero(~ok)[0])
            b.launch.fail(
                f"{b.who(lanes[j])} waits on mbarrier {s.bar}[{index[j]}] for the phase of parity "
                f"{parity[j]}, which has not completed ({self.pending[blk[j], slot[j]]} arrivals "
                f"and {self.tx[blk[j], slot[j]]} transaction bytes pending): on the GPU it waits "
                f"forever, or for work the lock-step simulator runs later")
        seen = lanes[ok]
        self.observed[seen, slot[ok]] = np.maximum(self.observed[seen, slot[ok]], completed[ok])
        if isinstance(s, MbarTryWait):
            b.set_var(s.var, "bool", ok, idx)

    # ------------------------------------------------------------ TMA

    def tma_load(self, s: TmaLoad, idx) -> None:
        b = self.batch
        p = b.launch.params.get(s.tmap)
        sh = b.smem.get(s.dst)
        if p is None or p.tensor_map is None or sh is None:
            b.launch.fail(f"TMA load {s.tmap} -> {s.dst}: needs a tensor-map parameter and a "
                          f"shared array")
        tm, item = p.tensor_map, dtypes.ITEMSIZE[p.dtype]
        width = SWIZZLE_BYTES[tm.swizzle]
        if width and tm.box[0] * item != width:
            b.launch.fail(f"TMA load from {s.tmap}: the simulator models {tm.swizzle} swizzled "
                          f"boxes whose inner row is {width} bytes, not {tm.box[0] * item}")
        lanes, blk, slot, index = self.slots(s.bar, s.bar_index, idx, "TMA load")
        coords = np.stack([b.ints(b.eval(c, idx), idx) for c in s.coords], axis=1)   # (L, rank)
        dst = b.ints(b.eval(s.dst_index, idx), idx)
        bad = (dst * item) % 128 != 0
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            b.launch.fail(f"TMA destination {s.dst}[{dst[j]}] is not 128-byte aligned, by "
                          f"{b.who(lanes[j])}")
        box, e = box_offsets(tm)
        g = coords[:, None, :] + box[None, :, :]                                  # (L, E, rank)
        inb = ((g >= 0) & (g < np.asarray(tm.dims))).all(axis=2)
        pitch = np.asarray((1,) + tuple(st // item for st in tm.strides), dtype=np.int64)
        src = (g * pitch).sum(axis=2)
        nl, ne = inb.shape
        rep = np.repeat(lanes, ne)
        values = np.zeros(nl * ne, dtype=compute_numpy(p.dtype))
        flat = inb.reshape(-1)
        if flat.any():
            values[flat] = b.load(s.tmap, src.reshape(-1)[flat], rep[flat], what="TMA read")
        base = self.bases[s.dst]
        addr = base + dst[:, None] * item + e[None, :] * item
        elem = ((swizzle(addr, tm.swizzle) - base) // item).reshape(-1)
        b.check_bounds(s.dst, elem, sh.decl.size, rep, "shared TMA write to")
        eblk, etid = b.local[rep], b.tid[rep]
        b.check_shared_write(s.dst, sh, elem, rep, eblk, etid)
        sh.data[eblk, elem] = to_storage(values, sh.decl.dtype)
        sh.writer[eblk, elem] = -1           # no thread: visible through the barrier only
        sh.epoch[eblk, elem] = -1
        sh.unfenced[eblk, elem] = False      # written by the async proxy itself
        if sh.tma_slot is None:
            sh.tma_slot = np.full(sh.data.shape, -1, dtype=np.int64)
            sh.tma_phase = np.zeros(sh.data.shape, dtype=np.int64)
        sh.tma_slot[eblk, elem] = np.repeat(slot, ne)
        sh.tma_phase[eblk, elem] = np.repeat(self.phase[blk, slot], ne)
        np.add.at(self.tx, (blk, slot), -tm.box_elems * item)
        self.complete(blk, slot, s.bar, index)

    def check_read(self, buf: str, sh, blk, i, lanes) -> None:
        """Fail if lanes read TMA data whose barrier phase they have not waited for."""
        sl = sh.tma_slot[blk, i]
        m = sl >= 0
        if not m.any():
            return
        bad = np.zeros(len(sl), dtype=bool)
        bad[m] = self.observed[lanes[m], sl[m]] <= sh.tma_phase[blk[m], i[m]]
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            b = self.batch
            b.launch.fail(f"{b.who(lanes[j])} reads {buf}[{i[j]}] before waiting on the mbarrier "
                          f"phase its TMA copy completes on (missing mbarrier wait)")

    def check_write(self, buf: str, sh, i, lanes, blk) -> None:
        """Overwriting TMA data needs the same wait as reading it; afterwards it is plain data."""
        if sh.tma_slot is None:
            return
        self.check_read(buf, sh, blk, i, lanes)
        sh.tma_slot[blk, i] = -1

    # ------------------------------------------------------------ dispatch

    def run(self, s, idx) -> None:
        if isinstance(s, MbarInit):
            self.mbar_init(s, idx)
        elif isinstance(s, MbarArrive):
            self.mbar_arrive(s, idx)
        elif isinstance(s, (MbarWait, MbarTryWait)):
            self.mbar_wait(s, idx)
        elif isinstance(s, TmaLoad):
            self.tma_load(s, idx)
        elif isinstance(s, FenceProxyAsync):
            self.fence_proxy(idx)

    def fence_proxy(self, idx) -> None:
        """fence.proxy.async by these threads: what each of them wrote to shared memory by an
        ordinary store is visible to the async proxy (wgmma) from now on."""
        b = self.batch
        lanes = b.lanes(idx)
        blk, tid = b.local[lanes], b.tid[lanes]
        for sh in b.smem.values():
            for bb in np.unique(blk):
                sh.unfenced[bb] &= ~np.isin(sh.writer[bb], tid[blk == bb])
