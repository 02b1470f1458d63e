"""wgmma in the simulator: warpgroup MMA m64nNk16 (f16/bf16 in; k32 for FP8; f32 accumulators)
reading A and B from shared memory through 64-bit descriptors, accumulators in PTX's layout,
so that a wrong descriptor, swizzle or lane mapping gives wrong numbers here as on the GPU.

Descriptor (PTX "matrix descriptor"): bits 0-13 start address >> 4, 16-29 leading-dimension byte
offset (LBO) >> 4, 32-45 stride-dimension byte offset (SBO) >> 4, 49-51 base offset (must be 0
here), 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B). With the transpose bit of an operand 0
(imm-trans-a / imm-trans-b) it is K-major: row r (of A's 64 or B's N rows), element k of the
32-byte K slice (k < 16 16-bit or 32 FP8 elements of E bytes, P = 16 / E to a core matrix row)
is at byte
  no swizzle:    start + (r // 8) * SBO + (r % 8) * 16 + (k // P) * LBO + (k % P) * E
  swizzle S:     swz(start + (r // 8) * SBO + (r % 8) * S + E * k)     (LBO unused)
With it 1 the operand is MN-major (M- or N-contiguous), 16-bit elements only. The PTX ISA's
canonical layouts (9.7.15.5.1.2.1.3, CuTe notation in elements, T = 8 for 16 bits):
  no swizzle:  ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
  swizzle S:   ((T,S/16,m),(8,k)):((1,T,LBO),(S/16 T,SBO))   under Swizzle<log2(S/16),4,3>
so MN index r and K index k sit at byte
  no swizzle:    start + (r // 8) * SBO + (r % 8) * 2 + (k // 8) * LBO + (k % 8) * 16
  swizzle S:     swz(start + (r // (S/2)) * LBO + (r % (S/2)) * 2 + (k // 8) * SBO + (k % 8) * S)
(LBO: "offset from the first (S/16) rows to the next (S/16) rows" of the 128-bit normalized
matrix, i.e. between MN runs of S bytes; SBO: "from the first 8 columns to the next 8": between
groups of 8 K rows). swz XORs the 16-byte chunk bits with the 128-byte row bits
(sim_tma.swizzle). Addresses are the simulated ones of sim_tma.smem_bases.

Accumulator d[i] of thread T (T < 128 in its warpgroup, w = T // 32, l = T % 32):
  row 16 w + l // 4 + 8 * (i // 2 % 2), col 8 * (i // 4) + 2 * (l % 4) + i % 2.
Accumulation as in sim_mma.py: products exact in f32, added one k at a time in increasing k.

A in registers (Wgmma.a_regs): each warp of the warpgroup gives its 16 rows as mma.m16n8k16's A
fragment (sim_mma.py's layout); those registers, like the accumulators, need a wgmma.fence after
an ordinary write and may not be written until the group completes.

Asynchrony, per thread as in PTX: a wgmma joins the open group, WgmmaCommit closes it,
WgmmaWait(n) completes all but the n most recent groups. Until its group completes, reading or
writing a wgmma's accumulators by any other statement is a SimError ("missing
wgmma.wait_group"), and so is writing the shared elements it reads. A wgmma whose accumulators
were written by an ordinary statement since this thread's last WgmmaFence fails ("missing
wgmma.fence"); chained wgmmas on the same accumulators need no fence, as in PTX. Reads of
accumulators by ordinary statements are not tracked for the fence rule. The shared reads are
charged to the warpgroup's threads (element e to thread e % 128), so TMA data needs every
thread's mbarrier wait and the race rules of sim.py apply.
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes
from ..core.expr import free_vars
from .ir import (
    SWIZZLE_BYTES,
    SWIZZLES,
    Wgmma,
    WgmmaCommit,
    WgmmaDesc,
    WgmmaFence,
    WgmmaWait,
    walk,
)
from . import sim_mma
from .sim_tma import swizzle

WGMMA_STMTS = (Wgmma, WgmmaFence, WgmmaCommit, WgmmaWait)
_MODES = {v: k for k, v in SWIZZLES.items()}


def acc_layout(n: int) -> tuple[np.ndarray, np.ndarray]:
    """[i, T] -> (row, col) in the 64 x n accumulator of d[i] held by thread T of a warpgroup."""
    i = np.arange(n // 2)[:, None]
    t = np.arange(128)[None, :]
    w, lane = t // 32, t % 32
    return 16 * w + lane // 4 + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane % 4) + (i & 1)


def encode(addr, lbo: int, sbo: int, mode: str) -> np.ndarray:
    """Descriptor bits (as int64) of a byte address."""
    a = np.asarray(addr, dtype=np.int64)
    bits = (((a & 0x3FFFF) >> 4).astype(np.uint64)
            | np.uint64(((lbo >> 4) & 0x3FFF) << 16)
            | np.uint64(((sbo >> 4) & 0x3FFF) << 32)
            | np.uint64(SWIZZLES[mode] << 62))
    return bits.view(np.int64)


def decode(desc: int) -> tuple[int, int, int, int, str]:
    d = int(desc) & (2 ** 64 - 1)
    return ((d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4,
            (d >> 49) & 7, _MODES[(d >> 62) & 3])


def operand_addresses(desc: int, rows: int, mn_major: bool = False, item: int = 2) -> np.ndarray:
    """(rows, 32 // item) byte addresses of the operand of `item`-byte elements described by
    `desc`: [r, k] is row r (M or N) and k of the K slice; K-major, or MN-major (transpose bit 1,
    16-bit only)."""
    start, lbo, sbo, _, mode = decode(desc)
    r = np.arange(rows)[:, None]
    k = np.arange(32 // item)[None, :]
    s = SWIZZLE_BYTES[mode]
    if mn_major:
        if not s:
            return start + (r // 8) * sbo + (r % 8) * 2 + (k // 8) * lbo + (k % 8) * 16
        run = s // 2                     # elements of one MN run of S bytes
        return swizzle(start + (r // run) * lbo + (r % run) * 2 + (k // 8) * sbo + (k % 8) * s,
                       mode)
    per = 16 // item
    if not s:
        return start + (r // 8) * sbo + (r % 8) * 16 + (k // per) * lbo + (k % per) * item
    return swizzle(start + (r // 8) * sbo + (r % 8) * s + item * k, mode)


class _Record:
    """The shared elements one Wgmma statement reads, held until its group completes."""

    def __init__(self, lanes, group, reads):
        self.lanes, self.group, self.reads = lanes, group, reads     # lanes (W, 128)
        self.left = np.ones(lanes.shape, dtype=bool)
        self.released = np.zeros(lanes.shape[0], dtype=bool)


class WgmmaState:
    """The wgmma state of one batch of blocks."""

    def __init__(self, batch):
        self.batch = batch
        wgmmas = [s for s in walk(batch.k.body) if isinstance(s, Wgmma)]
        # every register a wgmma reads or writes (its writes by other statements are watched)
        self.acc_names = {v for s in wgmmas for v in s.d + s.a_regs}
        self.committed = np.zeros(batch.n, dtype=np.int64)
        self.pending: dict[str, np.ndarray] = {}     # accumulator -> group per lane, -1: none
        self.reading: dict[str, np.ndarray] = {}     # A register -> group per lane, -1: none
        self.dirty: dict[str, np.ndarray] = {}       # written since the lane's last fence
        self.records: list[_Record] = []

    # ------------------------------------------------------------ hooks from sim.py

    def descriptor(self, e: WgmmaDesc, index: np.ndarray) -> np.ndarray:
        b = self.batch
        sh = b.smem.get(e.buf)
        if sh is None:
            b.launch.fail(f"wgmma descriptor of {e.buf}, which is not a shared array")
        index = np.asarray(index, dtype=np.int64)
        addr = b.tma.bases[e.buf] + dtypes.ITEMSIZE[sh.decl.dtype] * index
        bad = addr % 16 != 0
        if np.any(bad):
            b.launch.fail(f"wgmma descriptor of {e.buf}[{np.asarray(index).flat[np.flatnonzero(bad)[0]]}]"
                          f": the start address is not 16-byte aligned")
        return encode(addr, e.lbo, e.sbo, e.swizzle)

    def check_expr(self, e, idx) -> None:
        """Fail if the active lanes read an accumulator of a wgmma still in flight."""
        if not self.pending:
            return
        for name in free_vars(e) & self.pending.keys():
            self._check_not_pending(name, idx, "reads")

    def on_write(self, name: str, idx) -> None:
        self._check_not_pending(name, idx, "writes")
        r, lanes = self.reading.get(name), self.batch.lanes(idx)
        if r is not None and (r[lanes] >= 0).any():
            j = int(np.flatnonzero(r[lanes] >= 0)[0])
            self.batch.launch.fail(f"{self.batch.who(lanes[j])} writes {name}, an A register of a "
                                   f"wgmma still in flight (missing wgmma.wait_group)")
        d = self.dirty.setdefault(name, np.zeros(self.batch.n, dtype=bool))
        d[lanes] = True

    def check_smem_write(self, buf: str, sh, i, lanes, blk) -> None:
        if sh.wgmma_reads is None:
            return
        busy = sh.wgmma_reads[blk, i] > 0
        if busy.any():
            j = int(np.flatnonzero(busy)[0])
            self.batch.launch.fail(f"{self.batch.who(lanes[j])} writes {buf}[{i[j]}] while a wgmma "
                                   f"that reads it is in flight (missing wgmma.wait_group)")

    def _check_not_pending(self, name, idx, verb) -> None:
        p = self.pending.get(name)
        if p is None:
            return
        lanes = self.batch.lanes(idx)
        bad = p[lanes] >= 0
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            self.batch.launch.fail(f"{self.batch.who(lanes[j])} {verb} {name}, an accumulator of a "
                                   f"wgmma still in flight (missing wgmma.wait_group)")

    # ------------------------------------------------------------ statements

    def run(self, s, idx) -> None:
        b = self.batch
        lanes = b.lanes(idx)
        if isinstance(s, Wgmma):
            self.mma(s, idx)
        elif isinstance(s, WgmmaFence):
            self.check_warpgroups(idx, "wgmma.fence")
            for d in self.dirty.values():
                d[lanes] = False
        elif isinstance(s, WgmmaCommit):
            self.check_warpgroups(idx, "wgmma.commit_group")
            self.committed[lanes] += 1
        elif isinstance(s, WgmmaWait):
            self.check_warpgroups(idx, "wgmma.wait_group")
            self.wait(s.pending, lanes)

    def check_warpgroups(self, idx, what: str) -> None:
        b = self.batch
        if b.bs % 128:
            b.launch.fail(f"{what} in a block of {b.bs} threads (not whole warpgroups)")
        if idx is None:
            return
        counts = np.bincount(idx // 128, minlength=b.n // 128)
        partial = (counts != 0) & (counts != 128)
        if partial.any():
            w = int(np.flatnonzero(partial)[0])
            live = set(idx[(idx // 128) == w].tolist())
            off = next(x for x in range(w * 128, w * 128 + 128) if x not in live)
            b.launch.fail(f"{what} with inactive threads: {b.who(off)} is not active while "
                          f"{counts[w]} threads of its warpgroup execute it")

    def uniform(self, e, idx, wl, what: str) -> np.ndarray:
        b = self.batch
        v = b.ints(b.eval(e, idx), idx).reshape(wl.shape)
        bad = (v != v[:, :1]).any(axis=1)
        if bad.any():
            w = int(np.flatnonzero(bad)[0])
            b.launch.fail(f"wgmma {what} differs across the warpgroup of {b.who(wl[w, 0])}")
        return v[:, 0]

    def operand(self, desc: int, rows: int, wl_row, what: str, dtype: str, mn_major: bool = False):
        """(buf, element indices (rows, k)) of one warpgroup's operand of `dtype`."""
        b = self.batch
        start, _, _, base_off, _ = decode(desc)
        if base_off:
            b.launch.fail(f"wgmma {what} descriptor has base offset {base_off} (not modelled)")
        item = dtypes.ITEMSIZE[dtype]
        addr = operand_addresses(desc, rows, mn_major, item)
        for name, base in b.tma.bases.items():
            sh = b.smem[name]
            end = base + sh.decl.size * dtypes.ITEMSIZE[sh.decl.dtype]
            if base <= start < end:
                if addr.min() < base or addr.max() + item > end:
                    b.launch.fail(f"wgmma {what} operand runs outside shared array {name}, "
                                  f"issued by {b.who(wl_row[0])}")
                if sh.decl.dtype != dtype:
                    b.launch.fail(f"wgmma.{dtype} {what} operand in {name} of {sh.decl.dtype}")
                return name, (addr - base) // item
        b.launch.fail(f"wgmma {what} descriptor points at no shared array, issued by "
                      f"{b.who(wl_row[0])}")

    def mma(self, s: Wgmma, idx) -> None:
        b = self.batch
        self.check_warpgroups(idx, "wgmma")
        lanes = b.lanes(idx)
        wl = lanes.reshape(-1, 128)
        nw = wl.shape[0]
        for name in s.d + s.a_regs:
            if name not in b.env:
                b.launch.fail(f"wgmma reads {name} before it is set")
            d = self.dirty.get(name)
            if d is not None and d[lanes].any():
                j = int(np.flatnonzero(d[lanes])[0])
                what = "A register" if name in s.a_regs else "accumulator"
                b.launch.fail(f"wgmma {what} {name} was written by {b.who(lanes[j])} since "
                              f"its last wgmma.fence (missing wgmma.fence)")
        a_desc = None if s.a_regs else self.uniform(s.a, idx, wl, "A descriptor")
        b_desc = self.uniform(s.b, idx, wl, "B descriptor")
        scale = np.ones(nw, dtype=bool) if s.scale_d is None else \
            self.uniform(s.scale_d, idx, wl, "scale-d") != 0
        A = np.empty((nw, 64, s.k), np.float32)
        B = np.empty((nw, s.n, s.k), np.float32)
        reads = []
        if s.a_regs:                # each warp's 16 rows, as mma.m16n8k16's A fragment
            regs = np.stack([b.env[v][lanes] for v in s.a_regs], axis=0)        # (4, W * 128)
            warps = np.moveaxis(regs.reshape(4, nw * 4, 32), 1, 0)             # (W * 4, 4, 32)
            A16 = np.empty((nw * 4, 16, 16), np.float32)
            A16[:, sim_mma.A_ROW, sim_mma.A_COL] = np.moveaxis(sim_mma.unpack(warps, s.dtype), -1, 2)
            A[:] = A16.reshape(nw, 64, 16)
        for w in range(nw):
            operands = [] if s.a_regs else [(A, a_desc[w], 64, "A", s.trans_a)]
            for mat, desc, rows, what, tr in operands + [(B, b_desc[w], s.n, "B", s.trans_b)]:
                buf, elem = self.operand(int(desc), rows, wl[w], what, s.dtype, tr)
                who = wl[w][np.arange(elem.size) % 128]
                sh, flat = b.smem[buf], elem.reshape(-1)
                stale = sh.unfenced[b.local[who], flat]
                if stale.any():
                    j = int(np.flatnonzero(stale)[0])
                    b.launch.fail(f"wgmma reads {buf}[{flat[j]}], which thread "
                                  f"{sh.writer[b.local[who[j]], flat[j]]} wrote by an ordinary store "
                                  f"with no fence.proxy.async since (missing fence.proxy.async)")
                mat[w] = np.asarray(b.load(buf, elem.reshape(-1), who, what=f"wgmma {what} read"),
                                    np.float32).reshape(elem.shape)
                reads.append((buf, b.local[who], elem.reshape(-1)))
        rows, cols = acc_layout(s.n)
        acc = np.zeros((nw, 64, s.n), np.float32)
        regs = np.stack([b.env[v][lanes] for v in s.d], axis=0).reshape(len(s.d), nw, 128)
        acc[:, rows, cols] = np.moveaxis(regs.astype(np.float32), 1, 0)
        acc[~scale] = 0
        for k in range(s.k):
            acc += A[:, :, k, None] * B[:, None, :, k]
        out = acc[:, rows, cols]                              # (W, n/2, 128)
        for i, name in enumerate(s.d):
            b.env[name][lanes] = out[:, i, :].reshape(-1)
            p = self.pending.setdefault(name, np.full(b.n, -1, dtype=np.int64))
            p[lanes] = self.committed[lanes]
        for name in s.a_regs:
            r = self.reading.setdefault(name, np.full(b.n, -1, dtype=np.int64))
            r[lanes] = self.committed[lanes]
        for buf, blk, elem in reads:
            sh = b.smem[buf]
            if sh.wgmma_reads is None:
                sh.wgmma_reads = np.zeros(sh.data.shape, dtype=np.int32)
            np.add.at(sh.wgmma_reads, (blk, elem), 1)
        self.records.append(_Record(wl, self.committed[wl].copy(), reads))

    def wait(self, pending: int, lanes) -> None:
        done = self.committed - pending       # groups below this are complete, per lane
        active = np.zeros(self.batch.n, dtype=bool)
        active[lanes] = True
        for held in (self.pending, self.reading):
            for name in list(held):
                p = held[name]
                p[active & (p >= 0) & (p < done)] = -1
                if (p < 0).all():
                    del held[name]
        keep = []
        for r in self.records:
            r.left &= ~(active[r.lanes] & (r.group < done[r.lanes]))
            free = ~r.left.any(axis=1) & ~r.released
            if free.any():
                r.released |= free
                nread = len(r.reads) // r.lanes.shape[0]
                for w in np.flatnonzero(free):
                    for buf, blk, elem in r.reads[w * nread:(w + 1) * nread]:
                        np.add.at(self.batch.smem[buf].wgmma_reads, (blk, elem), -1)
            if not r.released.all():
                keep.append(r)
        self.records = keep
