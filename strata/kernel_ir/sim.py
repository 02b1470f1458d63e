"""The GPU simulator and sanitizer: runs Kernel IR on the CPU in lock-step SIMT.

Every thread of a batch of blocks is one *lane*; every variable is a NumPy array with one element
per lane, and a statement runs for the *active* lanes only (an index array, or None for all).
`If` splits the active set, `For` keeps the lanes whose `var < stop` until none is left, `Sync`
bumps the barrier epoch of each block, shuffles permute lanes within a warp of 32. Blocks are
independent, so they run in batches of at most MAX_LANES lanes to bound memory.

Math runs in the compute dtype (float32 for f32/f16/bf16, like the GPU; int64 for integers).
Storage is described in sim_memory.py; `simulate` takes and returns bf16 tensors as float32
*values* (rounded to bf16), f16 as float16.

As the sanitizer it raises SimError, naming kernel, buffer, index and (block, thread), on:
  - an out-of-bounds global or shared access (scalar or vector), a store to a read-only param;
  - a vector access whose index is not a multiple of its width;
  - a shared read of an element another thread of the block wrote since the last barrier;
  - a shared write of an element another thread of the block read since the last barrier;
  - two threads of a block writing one shared element between barriers;
  - two threads writing one global element in one launch, or one thread reading a global
    element another thread wrote in the same launch (no grid-wide ordering exists);
  - a barrier reached by only part of a block;
  - a shuffle, ldmatrix or mma with inactive lanes in its warp, or in a block that is not
    whole warps; an ldmatrix row that is out of bounds or not 16-byte aligned;
  - a misaligned cp.async, or any shared access to a cp.async destination before the copy
    has landed (sim_async.py: copies land at the cp.async.wait_group that completes them).
Tensor-core fragments (ldmatrix, mma) follow the PTX layouts, see sim_mma.py. Hopper's TMA and
mbarrier phases are in sim_tma.py (reading TMA data before waiting on its phase fails), wgmma and
its groups in sim_wgmma.py (reading accumulators before wgmma.wait_group fails).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..core import dtypes
from ..core.errors import InputMismatch, SimError
from ..core.expr import Expr, evaluate
from . import sim_mma, sim_profile
from .ir import (Assign, Atomic, BlockIdx, Comment, CpAsync, CpAsyncCommit, CpAsyncWait, For, If, Kernel,
                 KernelProgram, LdMatrix, Let, Load, LoadVec, Mma, PackHalf2, PrefetchL2, ShflIdx,
                 ShflXor, Smem, Store, StoreVec, Sync, ThreadIdx, WgmmaDesc, While, walk)
from .cpu_ir import CpuForm
from .sim_async import AsyncCopies
from .sim_cpu import MEANINGS
from .sim_memory import convert, from_storage, poison, storage_numpy, to_storage, to_user
from .sim_tma import TMA_STMTS, TmaState
from .sim_wgmma import WGMMA_STMTS, WgmmaState

MAX_LANES = 1 << 20          # lanes (threads) simulated at once
MAX_SMEM_ELEMS = 1 << 22     # shared-memory elements (all arrays, all blocks) per batch


# ---------------------------------------------------------------- public entry points

def simulate(program: KernelProgram, inputs: Mapping[str, np.ndarray],
             storage: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Run every kernel of `program` in order; return the output buffers by name, shaped.

    Inputs and weights come from `inputs` (exact shape and NumPy dtype: bf16 as float32 values);
    outputs and temps start poisoned (NaN / sentinel) so that an unwritten element shows.
    `storage` may supply the flat storage array of some outputs/temps (e.g. views into one slab,
    as the CUDA runtime lays temps out); each is poisoned in place before the first kernel."""
    wanted = {b.name for b in program.buffers if b.kind in ("input", "weight")}
    extra = sorted(set(inputs) - wanted)
    if extra:
        raise InputMismatch(f"unexpected input {extra[0]!r}; the program takes {sorted(wanted)}")
    memory: dict[str, np.ndarray] = {}
    for b in program.buffers:
        if b.kind not in ("input", "weight"):
            memory[b.name] = poison(b.dtype, b.numel)
            if storage is not None and b.name in storage:
                storage[b.name][...] = memory[b.name]
                memory[b.name] = storage[b.name]
            continue
        if b.name not in inputs:
            raise InputMismatch(f"missing input {b.name!r} ({b.dtype}{list(b.shape)})")
        a = np.asarray(inputs[b.name])
        want = np.dtype(np.float32 if b.dtype in ("bf16", *dtypes.FLOAT8) else storage_numpy(b.dtype))
        if tuple(a.shape) != tuple(b.shape) or a.dtype != want:
            raise InputMismatch(f"input {b.name!r} is {a.dtype}{list(a.shape)}, expected "
                                f"{want}{list(b.shape)} ({b.dtype})")
        memory[b.name] = np.ascontiguousarray(to_storage(a.reshape(-1), b.dtype)).copy()
    for k in program.kernels:
        run_kernel(k, memory)
    out = {}
    for name in program.outputs:
        b = program.buffer(name)
        out[name] = to_user(memory[name], b.dtype).reshape(b.shape)
    return out


def run_kernel(kernel: Kernel, buffers: Mapping[str, np.ndarray],
               scalars: Mapping[str, object] | None = None) -> None:
    """Run one launch of `kernel` in place on flat storage arrays named like its params;
    `scalars` gives the value of each of kernel.scalars."""
    for p in kernel.params:
        a = buffers.get(p.name)
        if a is None:
            raise SimError(f"{kernel.name}: no buffer for parameter {p.name}.")
        if a.ndim != 1 or a.size != p.numel or a.dtype != storage_numpy(p.dtype):
            raise SimError(f"{kernel.name}: buffer {p.name} is {a.dtype}{list(a.shape)}, expected "
                           f"flat {np.dtype(storage_numpy(p.dtype))}[{p.numel}] ({p.dtype}).")
    launch = _Launch(kernel, buffers)
    for name, dtype in kernel.scalars:
        if scalars is None or name not in scalars:
            raise SimError(f"{kernel.name}: no value for scalar argument {name}.")
        launch.scalars[name] = (dtype, scalars[name])
    smem_elems = sum(s.size for s in launch.smem_decls.values())
    per_batch = max(1, min(MAX_LANES // kernel.block, MAX_SMEM_ELEMS // max(1, smem_elems)))
    with np.errstate(all="ignore"):
        for b0 in range(0, kernel.grid, per_batch):
            _Batch(launch, b0, min(per_batch, kernel.grid - b0)).run(kernel.body, None)


# ---------------------------------------------------------------- one launch

class _Launch:
    """State shared by all batches of one launch: global memory and its writers."""

    def __init__(self, kernel: Kernel, buffers):
        self.kernel = kernel
        self.params = {p.name: p for p in kernel.params}
        self.memory = buffers
        self.writers: dict[str, np.ndarray] = {}    # global buffer -> writing thread id, -1
        self.scalars: dict[str, tuple] = {}           # name -> (dtype, value)
        self.where = ""              # the last Comment run: the user's line, in errors
        self.profile = sim_profile.start(kernel)    # access counters, under --profile only
        self.smem_decls: dict[str, Smem] = {}
        for s in walk(kernel.body):
            if isinstance(s, Smem):
                old = self.smem_decls.setdefault(s.name, s)
                if old != s:
                    raise SimError(f"{kernel.name}: shared array {s.name} is declared twice "
                                   f"differently.")

    def fail(self, what: str) -> None:
        at = f" at {self.where}" if self.where else ""
        raise SimError(f"{self.kernel.name}: {what}{at}.")


class _Shared:
    """One Smem array for every block of a batch, with its sanitizer bookkeeping."""

    def __init__(self, decl: Smem, nblocks: int):
        self.decl = decl
        self.data = poison(decl.dtype, nblocks * decl.size).reshape(nblocks, decl.size)
        self.writer = np.full((nblocks, decl.size), -1, dtype=np.int32)    # last writer thread
        self.epoch = np.full((nblocks, decl.size), -1, dtype=np.int32)     # ... in this epoch
        self.reader = np.full((nblocks, decl.size), -1, dtype=np.int32)    # reader, -2: several
        self.repoch = np.full((nblocks, decl.size), -1, dtype=np.int32)    # ... in this epoch
        self.inflight = None      # bool array once a cp.async targets it: not landed yet
        self.tma_slot = self.tma_phase = None   # sim_tma.py: the barrier phase TMA data lands in
        self.wgmma_reads = None   # sim_wgmma.py: in-flight wgmma reads per element
        # written by an ordinary store (or cp.async) and not yet fenced for the async proxy
        # (fence.proxy.async by the writer): wgmma may not read it (sim_wgmma.py)
        self.unfenced = np.zeros((nblocks, decl.size), dtype=bool)

    def note_reads(self, blk, i, tid, epoch) -> None:
        """Record that threads `tid` read elements `i` in barrier epoch `epoch`."""
        old = self.reader[blk, i]
        new = np.where((self.repoch[blk, i] != epoch) | (old == tid), tid, -2).astype(np.int32)
        self.reader[blk, i] = new
        self.repoch[blk, i] = epoch
        several = self.reader[blk, i] != new           # another lane read it in this statement
        if several.any():
            self.reader[blk[several], i[several]] = -2


class _View(Mapping):
    """The variables as seen by the active lanes (gathered lazily, once per statement)."""

    def __init__(self, env, idx):
        self.env, self.idx, self.cache = env, idx, {}

    def __getitem__(self, name):
        if self.idx is None:
            return self.env[name]
        v = self.cache.get(name)
        if v is None:
            v = self.cache[name] = self.env[name][self.idx]
        return v

    def __iter__(self):
        return iter(self.env)

    def __len__(self):
        return len(self.env)


class _Batch:
    """Blocks [b0, b0 + nblocks) of a launch, executed in lock step."""

    def __init__(self, launch: _Launch, b0: int, nblocks: int):
        k = launch.kernel
        self.launch, self.k, self.nb, self.bs = launch, k, nblocks, k.block
        self.n = nblocks * k.block
        self.all = np.arange(self.n, dtype=np.int64)
        self.tid = np.tile(np.arange(k.block, dtype=np.int64), nblocks)
        self.local = np.repeat(np.arange(nblocks, dtype=np.int64), k.block)
        self.bid = self.local + b0
        self.gtid = self.bid * k.block + self.tid
        self.warp = self.local * -(-k.block // 32) + self.tid // 32     # warps of the batch
        self.env: dict[str, np.ndarray] = {}
        self.types: dict[str, str] = {}
        self.smem = {n: _Shared(d, nblocks) for n, d in launch.smem_decls.items()}
        self.epoch = np.zeros(nblocks, dtype=np.int32)
        self.copies = AsyncCopies(self)
        self.tma = TmaState(self)
        self.wgmma = WgmmaState(self)
        for name, (dtype, value) in launch.scalars.items():
            self.set_var(name, dtype, np.asarray(value), None)

    # ------------------------------------------------------------ helpers

    def lanes(self, idx):
        return self.all if idx is None else idx

    def count(self, idx) -> int:
        return self.n if idx is None else len(idx)

    def who(self, lane) -> str:
        return f"block {int(self.bid[lane])}, thread {int(self.tid[lane])}"

    def first(self, idx, bad) -> int:
        return int(self.lanes(idx)[int(np.flatnonzero(bad)[0])])

    def ints(self, v, idx) -> np.ndarray:
        return np.broadcast_to(np.asarray(v).astype(np.int64, copy=False), (self.count(idx),))

    def sub(self, idx, mask):
        """The active lanes where mask holds (None stays None when all do)."""
        mask = np.broadcast_to(np.asarray(mask, dtype=bool), (self.count(idx),))
        if mask.all():
            return idx
        return self.lanes(idx)[mask]

    def set_var(self, name: str, dtype: str, value, idx) -> None:
        if name in self.wgmma.acc_names:
            self.wgmma.on_write(name, idx)
        value = convert(value, dtype)
        arr = self.env.get(name)
        if idx is None:
            arr = np.empty(self.n, dtype=value.dtype)
            arr[...] = value
            self.env[name] = arr
        else:
            if arr is None or arr.dtype != value.dtype:
                arr = self.env[name] = np.zeros(self.n, dtype=value.dtype)
            arr[idx] = value
        self.types[name] = dtype

    # ------------------------------------------------------------ expressions

    def eval(self, e: Expr, idx):
        self.wgmma.check_expr(e, idx)
        view = _View(self.env, idx)

        def extra(x, go):
            if isinstance(x, ThreadIdx):
                return self.tid if idx is None else self.tid[idx]
            if isinstance(x, BlockIdx):
                return self.bid if idx is None else self.bid[idx]
            if isinstance(x, Load):
                return self.load(x.buf, self.ints(go(x.index), idx), idx)
            if isinstance(x, ShflXor):
                lane = self.lanes(idx) % 32
                return self.shuffle(go(x.value), lane ^ x.mask, idx)
            if isinstance(x, ShflIdx):
                return self.shuffle(go(x.value), self.ints(go(x.lane), idx) % 32, idx)
            if isinstance(x, WgmmaDesc):
                return self.wgmma.descriptor(x, self.ints(go(x.index), idx))
            raise SimError(f"{self.k.name}: cannot simulate expression {x!r}.")
        return evaluate(e, view, extra)

    def check_bounds(self, buf, index, size, idx, what, width=1):
        bad = (index < 0) | (index + (width - 1) >= size)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            span = f"{buf}[{index[i]}]" if width == 1 else f"{buf}[{index[i]}:{index[i] + width}]"
            who = self.who(self.first(idx, bad))
            self.launch.fail(f"out-of-bounds {what} {span} (size {size}) by {who}")

    def load(self, buf: str, index: np.ndarray, idx, width: int = 1, what: str = "load"):
        lanes = self.lanes(idx)
        sh = self.smem.get(buf)
        if sh is not None:
            self.check_bounds(buf, index, sh.decl.size, idx, f"shared {what} of", width)
            self.count_access("shared", "load", lanes, index, width, sh.decl.dtype)
            blk = self.local[lanes]
            out = []
            for k in range(width):
                i = index + k
                if sh.inflight is not None and sh.inflight[blk, i].any():
                    j = int(np.flatnonzero(sh.inflight[blk, i])[0])
                    self.launch.fail(
                        f"{self.who(lanes[j])} reads {buf}[{i[j]}] before the cp.async that "
                        f"writes it has landed (missing cp.async.wait_group)")
                bad = (sh.epoch[blk, i] == self.epoch[blk]) & (sh.writer[blk, i] != self.tid[lanes])
                if bad.any():
                    j = int(np.flatnonzero(bad)[0])
                    self.launch.fail(
                        f"shared-memory race: {self.who(lanes[j])} reads {buf}[{i[j]}] written by "
                        f"thread {sh.writer[blk[j], i[j]]} since the last barrier (missing Sync)")
                if sh.tma_slot is not None:
                    self.tma.check_read(buf, sh, blk, i, lanes)
                sh.note_reads(blk, i, self.tid[lanes], self.epoch[blk])
                out.append(from_storage(sh.data[blk, i], sh.decl.dtype))
            return out if width > 1 else out[0]
        p = self.launch.params.get(buf)
        if p is None:
            self.launch.fail(f"load from unknown buffer {buf}")
        self.check_bounds(buf, index, p.numel, idx, what + " of", width)
        self.count_access("global", "load", lanes, index, width, p.dtype)
        writers = self.launch.writers.get(buf)
        mem = self.launch.memory[buf]
        out = []
        for k in range(width):
            i = index + k
            if writers is not None:
                w = writers[i]
                bad = (w >= 0) & (w != self.gtid[lanes])
                if bad.any():
                    j = int(np.flatnonzero(bad)[0])
                    self.launch.fail(
                        f"global race: {self.who(lanes[j])} reads {buf}[{i[j]}] written in the "
                        f"same launch by block {w[j] // self.bs}, thread {w[j] % self.bs}")
            out.append(from_storage(mem[i], p.dtype))
        return out if width > 1 else out[0]

    def prefetch(self, s: PrefetchL2, idx) -> None:
        """An L2 prefetch changes no value: its range must lie in its (global) buffer, whole
        16-byte pieces from a 16-byte boundary."""
        p = self.launch.params.get(s.buf)
        if p is None or s.buf in self.smem:
            self.launch.fail(f"prefetch of {s.buf}, which is not a global buffer of the kernel")
        size = dtypes.ITEMSIZE[p.dtype]
        index = self.ints(self.eval(s.index, idx), idx)
        if s.nbytes % 16 or s.nbytes < size or (index * size % 16).any():
            self.launch.fail(f"prefetch of {s.nbytes} bytes of {s.buf} from a 16-byte boundary "
                             f"in whole 16-byte pieces, was {s.nbytes} from element {index[0]}")
        self.check_bounds(s.buf, index, p.numel, idx, "prefetch of", s.nbytes // size)

    def store(self, buf: str, index: np.ndarray, values, idx, what: str = "store") -> None:
        lanes = self.lanes(idx)
        width = len(values)
        sh = self.smem.get(buf)
        if sh is not None:
            self.check_bounds(buf, index, sh.decl.size, idx, f"shared {what} to", width)
            self.count_access("shared", "store", lanes, index, width, sh.decl.dtype)
            blk, tid = self.local[lanes], self.tid[lanes]
            for k, v in enumerate(values):
                i = index + k
                self.check_shared_write(buf, sh, i, lanes, blk, tid)
                sh.writer[blk, i] = tid
                bad = sh.writer[blk, i] != tid
                if bad.any():
                    j = int(np.flatnonzero(bad)[0])
                    self.launch.fail(
                        f"shared-memory race: {self.who(lanes[j])} and thread "
                        f"{sh.writer[blk[j], i[j]]} write {buf}[{i[j]}] at once")
                sh.epoch[blk, i] = self.epoch[blk]
                sh.unfenced[blk, i] = True
                sh.data[blk, i] = to_storage(np.broadcast_to(v, i.shape), sh.decl.dtype)
            return
        p = self.launch.params.get(buf)
        if p is None:
            self.launch.fail(f"store to unknown buffer {buf}")
        if not p.output:
            self.launch.fail(f"store to read-only parameter {buf} by {self.who(lanes[0])}")
        self.check_bounds(buf, index, p.numel, idx, what + " to", width)
        self.count_access("global", "store", lanes, index, width, p.dtype)
        writers = self.launch.writers.get(buf)
        if writers is None:
            writers = self.launch.writers[buf] = np.full(p.numel, -1, dtype=np.int64)
        gtid = self.gtid[lanes]
        mem = self.launch.memory[buf]
        for k, v in enumerate(values):
            i = index + k
            w = writers[i]
            bad = (w >= 0) & (w != gtid)
            if not bad.any():
                writers[i] = gtid
                bad = writers[i] != gtid
                w = writers[i]
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                self.launch.fail(
                    f"global race: {self.who(lanes[j])} and block {w[j] // self.bs}, thread "
                    f"{w[j] % self.bs} both write {buf}[{i[j]}] in one launch")
            mem[i] = to_storage(np.broadcast_to(v, i.shape), p.dtype)

    def count_access(self, space: str, kind: str, lanes, index, width: int, dtype: str) -> None:
        prof = self.launch.profile
        if prof is not None:
            size = sim_profile.itemsize(dtype)
            request = prof.global_request if space == "global" else prof.shared_request
            request(kind, self.warp[lanes], np.asarray(index, dtype=np.int64) * size, width * size)

    def check_shared_write(self, buf, sh, i, lanes, blk, tid) -> None:
        """Fail if threads `tid` may not write shared elements `i` now: a cp.async to them is in
        flight, or another thread wrote or read them since the last barrier."""
        if sh.tma_slot is not None or sh.wgmma_reads is not None:
            self.wgmma.check_smem_write(buf, sh, i, lanes, blk)
            self.tma.check_write(buf, sh, i, lanes, blk)
        if sh.inflight is not None and sh.inflight[blk, i].any():
            j = int(np.flatnonzero(sh.inflight[blk, i])[0])
            self.launch.fail(f"{self.who(lanes[j])} writes {buf}[{i[j]}] while a cp.async to it "
                             f"is in flight (missing cp.async.wait_group)")
        bad = (sh.epoch[blk, i] == self.epoch[blk]) & (sh.writer[blk, i] != tid)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            self.launch.fail(
                f"shared-memory race: {self.who(lanes[j])} writes {buf}[{i[j]}] also "
                f"written by thread {sh.writer[blk[j], i[j]]} since the last barrier")
        rd = sh.reader[blk, i]
        bad = (sh.repoch[blk, i] == self.epoch[blk]) & (rd != -1) & (rd != tid)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            other = "other threads" if rd[j] == -2 else f"thread {rd[j]}"
            self.launch.fail(
                f"shared-memory race: {self.who(lanes[j])} writes {buf}[{i[j]}] read by "
                f"{other} since the last barrier (missing Sync)")

    def check_whole_warps(self, idx, what: str, verb: str) -> None:
        """Fail unless every warp with an active lane has all 32 active (warp-collective ops)."""
        if self.bs % 32:
            self.launch.fail(f"{what} in a block of {self.bs} threads (not whole warps)")
        if idx is None:
            return
        counts = np.bincount(idx // 32, minlength=self.n // 32)
        partial = (counts != 0) & (counts != 32)
        if partial.any():
            w = int(np.flatnonzero(partial)[0])
            live = set(idx[(idx // 32) == w].tolist())
            off = next(x for x in range(w * 32, w * 32 + 32) if x not in live)
            self.launch.fail(f"{what} with inactive lanes: {self.who(off)} is not active "
                             f"while {counts[w]} lanes of its warp {verb}")

    def shuffle(self, values, src_lane, idx):
        self.check_whole_warps(idx, "warp shuffle", "shuffle")
        lanes = self.lanes(idx)
        values = np.broadcast_to(np.asarray(values), (len(lanes),))
        src = (lanes - lanes % 32) + np.asarray(src_lane, dtype=np.int64)
        if idx is None:
            return values[src]
        pos = np.full(self.n, -1, dtype=np.int64)
        pos[lanes] = np.arange(len(lanes))
        return values[pos[src]]

    # ------------------------------------------------------------ statements

    def run(self, body, idx) -> None:
        prof = self.launch.profile
        for s in body:
            if idx is not None and len(idx) == 0:
                return
            if prof is not None:
                live = self.lanes(idx)
                prof.issue(s, len(live), len(np.unique(self.warp[live])))
            step = STEPS.get(type(s)) or (MEANINGS.get(type(s), _no_meaning) if isinstance(s, CpuForm)
                                          else _unknown)
            step(self, s, idx)

    def assign(self, s: Assign, idx) -> None:
        if s.var not in self.types:
            self.launch.fail(f"assignment to undeclared variable {s.var}")
        self.set_var(s.var, self.types[s.var], self.eval(s.value, idx), idx)

    def load_vec(self, s: LoadVec, idx) -> None:
        index = self.vec_index(s.buf, s.index, len(s.vars), idx, "load")
        vals = self.load(s.buf, index, idx, len(s.vars), "vector load")
        for var, v in zip(s.vars, vals if len(s.vars) > 1 else [vals]):
            self.set_var(var, s.dtype, v, idx)

    def store_vec(self, s: StoreVec, idx) -> None:
        index = self.vec_index(s.buf, s.index, len(s.values), idx, "store")
        self.store(s.buf, index, [self.eval(v, idx) for v in s.values], idx, "vector store")

    def run_if(self, s: If, idx) -> None:
        cond = self.eval(s.cond, idx)
        cond = np.broadcast_to(np.asarray(cond) != 0, (self.count(idx),))
        then, orelse = self.sub(idx, cond), self.sub(idx, ~cond)
        if s.then and (then is None or len(then)):
            self.run(s.then, then)
        if s.orelse and (orelse is None or len(orelse)):
            self.run(s.orelse, orelse)

    def run_while(self, s: While, idx) -> None:
        cur = self.sub(idx, self.eval(s.cond, idx))
        while cur is None or len(cur):
            self.run(s.body, cur)
            cur = self.sub(cur, self.eval(s.cond, cur))

    def atomic(self, s: Atomic, idx) -> None:
        """Apply the lanes' updates one after another (in lane order): atomics never race with
        each other, so they are not recorded as writes."""
        lanes = self.lanes(idx)
        index = self.ints(self.eval(s.index, idx), idx)
        values = np.broadcast_to(np.asarray(self.eval(s.value, idx)), index.shape)
        sh = self.smem.get(s.buf)
        if sh is not None:
            self.check_bounds(s.buf, index, sh.decl.size, idx, "shared atomic on")
            mem, at, dtype = sh.data, (self.local[lanes], index), sh.decl.dtype
        else:
            p = self.launch.params.get(s.buf)
            if p is None or not p.output:
                self.launch.fail(f"atomic on {'read-only parameter' if p else 'unknown buffer'} "
                                 f"{s.buf}")
            self.check_bounds(s.buf, index, p.numel, idx, "atomic on")
            mem, at, dtype = self.launch.memory[s.buf], index, p.dtype
        ufunc = {"add": np.add, "max": np.fmax, "min": np.fmin}[s.op]
        ufunc.at(mem, at, to_storage(values, dtype))

    def vec_index(self, buf, index_expr, width, idx, what) -> np.ndarray:
        index = self.ints(self.eval(index_expr, idx), idx)
        bad = index % width != 0
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            self.launch.fail(f"misaligned vector {what} of {width} elements at {buf}[{index[i]}] "
                             f"(index not a multiple of {width}) by {self.who(self.first(idx, bad))}")
        return index

    def run_for(self, s: For, idx) -> None:
        if s.step <= 0:
            self.launch.fail(f"loop {s.var} has step {s.step}; only positive steps are supported")
        self.set_var(s.var, s.dtype, self.eval(s.start, idx), idx)
        start = self.env[s.var] if idx is None else self.env[s.var][idx]
        cur = self.sub(idx, start < self.eval(s.stop, idx))
        while cur is None or len(cur):
            self.run(s.body, cur)
            var = self.env[s.var]
            if cur is None:
                var += s.step
                cur = self.sub(None, var < self.eval(s.stop, None))
            else:
                var[cur] += s.step
                cur = self.sub(cur, var[cur] < self.eval(s.stop, cur))

    def sync(self, idx) -> None:
        if idx is None:
            self.epoch += 1
            return
        counts = np.bincount(self.local[idx], minlength=self.nb)
        partial = (counts != 0) & (counts != self.bs)
        if partial.any():
            b = int(np.flatnonzero(partial)[0])
            arrived = np.zeros(self.bs, dtype=bool)
            arrived[self.tid[idx[self.local[idx] == b]]] = True
            t_in, t_out = int(np.flatnonzero(arrived)[0]), int(np.flatnonzero(~arrived)[0])
            self.launch.fail(f"divergent barrier: in block {b + int(self.bid[0])} only "
                             f"{counts[b]} of {self.bs} threads reach Sync (thread {t_in} does, "
                             f"thread {t_out} does not)")
        self.epoch[counts == self.bs] += 1


def _no_meaning(batch, s, idx) -> None:
    batch.launch.fail(f"the simulator has no meaning for {type(s).__name__} (kernel_ir/sim_cpu.py)")


def _unknown(batch, s, idx) -> None:
    batch.launch.fail(f"cannot simulate statement {s!r}")


# What each statement does, by its class (a CPU form: sim_cpu.MEANINGS); tests check every
# statement class of kernel_ir/ir.py has one.
STEPS = {
    Let: lambda b, s, idx: b.set_var(s.var, s.dtype, b.eval(s.value, idx), idx),
    Assign: _Batch.assign,
    Store: lambda b, s, idx: b.store(s.buf, b.ints(b.eval(s.index, idx), idx), [b.eval(s.value, idx)], idx),
    LoadVec: _Batch.load_vec, StoreVec: _Batch.store_vec, For: _Batch.run_for, If: _Batch.run_if,
    While: _Batch.run_while, Atomic: _Batch.atomic, Sync: lambda b, s, idx: b.sync(idx),
    Comment: lambda b, s, idx: setattr(b.launch, "where", s.text), Smem: lambda b, s, idx: None,
    LdMatrix: sim_mma.run_ldmatrix, Mma: sim_mma.run_mma, PackHalf2: sim_mma.run_pack,
    CpAsync: lambda b, s, idx: b.copies.issue(s, idx),
    CpAsyncCommit: lambda b, s, idx: b.copies.commit(idx),
    PrefetchL2: lambda b, s, idx: b.prefetch(s, idx),
    CpAsyncWait: lambda b, s, idx: b.copies.wait(s.pending, idx),
    **{c: lambda b, s, idx: b.tma.run(s, idx) for c in TMA_STMTS},
    **{c: lambda b, s, idx: b.wgmma.run(s, idx) for c in WGMMA_STMTS},
}
