"""cp.async in the simulator: copies in flight, commit groups, and the moment a copy lands.

A CpAsync reads global memory when it is issued but writes shared memory only when a
CpAsyncWait of the issuing thread completes its group, so a kernel that reads the destination
too early reads nothing: until it lands the destination is *in flight*, and any shared access
to it fails ("missing cp.async.wait_group"). The landing is a store by the issuing thread, so
another thread that reads it without a Sync after the wait is caught as a race, as usual.

Groups follow PTX per thread: a copy joins the thread's open group, CpAsyncCommit closes it
(group number = commits so far), and CpAsyncWait(n) completes every group but the n most
recent committed ones; copies not yet committed are not waited for. The issue is checked like
a write (against earlier reads and writes by other threads since the last barrier) because the
hardware may write at any time after it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import dtypes
from .ir import CpAsync
from .sim_memory import compute_numpy


@dataclass
class _Copy:
    """One CpAsync statement's copies still in flight, one per lane."""
    buf: str
    lanes: np.ndarray         # batch lanes that issued them
    index: np.ndarray         # first destination element of each
    values: list[np.ndarray]  # element k of each copy (zero where not read)
    group: np.ndarray         # group each belongs to (the lane's commit count at issue)

    def only(self, keep: np.ndarray) -> _Copy:
        return _Copy(self.buf, self.lanes[keep], self.index[keep], [v[keep] for v in self.values],
                     self.group[keep])


class AsyncCopies:
    """The cp.async state of one batch of blocks."""

    def __init__(self, batch):
        self.batch = batch
        self.committed = np.zeros(batch.n, dtype=np.int64)    # groups committed, per lane
        self.pending: list[_Copy] = []

    def issue(self, s: CpAsync, idx) -> None:
        b = self.batch
        sh, p = b.smem.get(s.dst), b.launch.params.get(s.src)
        if sh is None or p is None:
            b.launch.fail(f"cp.async from {s.src} to {s.dst}: needs a global source and a shared "
                          f"destination")
        item = dtypes.ITEMSIZE[sh.decl.dtype]
        width = s.nbytes // item
        lanes = b.lanes(idx)
        dst = b.vec_index(s.dst, s.dst_index, width, idx, "cp.async")
        src = b.vec_index(s.src, s.src_index, width, idx, "cp.async")
        nread = b.ints(s.nbytes if s.src_bytes is None else b.eval(s.src_bytes, idx), idx)
        bad = (nread < 0) | (nread > s.nbytes) | (nread % item != 0)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            b.launch.fail(f"cp.async src_bytes {nread[j]} is not whole {sh.decl.dtype} elements in "
                          f"0..{s.nbytes}, by {b.who(lanes[j])}")
        nread = nread // item
        b.check_bounds(s.dst, dst, sh.decl.size, idx, "shared cp.async to", width)
        values = []
        for k in range(width):
            v = np.zeros(len(lanes), dtype=compute_numpy(p.dtype))
            read = nread > k
            if read.any():
                v[read] = b.load(s.src, src[read] + k, lanes[read], what="cp.async read")
            values.append(v)
        if sh.inflight is None:
            sh.inflight = np.zeros(sh.data.shape, dtype=bool)
        blk, tid = b.local[lanes], b.tid[lanes]
        for k in range(width):
            i = dst + k
            b.check_shared_write(s.dst, sh, i, lanes, blk, tid)
            key = blk * sh.decl.size + i
            uniq, first = np.unique(key, return_index=True)
            if len(uniq) != len(key):
                dup = np.setdiff1d(np.arange(len(key)), first)[0]
                b.launch.fail(f"cp.async: {b.who(lanes[dup])} and another thread both copy to "
                              f"{s.dst}[{i[dup]}] at once")
            sh.inflight[blk, i] = True
        self.pending.append(_Copy(s.dst, lanes, dst, values, self.committed[lanes].copy()))

    def commit(self, idx) -> None:
        self.committed[self.batch.lanes(idx)] += 1

    def wait(self, pending: int, idx) -> None:
        b = self.batch
        active = np.zeros(b.n, dtype=bool)
        active[b.lanes(idx)] = True
        done = self.committed - pending          # groups below this are complete, per lane
        still = []
        for c in self.pending:
            land = active[c.lanes] & (c.group < done[c.lanes])
            if land.any():
                self.land(c.only(land))
            if not land.all():
                still.append(c.only(~land))
        self.pending = still

    def land(self, c: _Copy) -> None:
        b = self.batch
        sh = b.smem[c.buf]
        blk = b.local[c.lanes]
        for k in range(len(c.values)):
            sh.inflight[blk, c.index + k] = False
        b.store(c.buf, c.index, c.values, c.lanes, "cp.async")
