"""Tile IR for a fused attention (mode "attention"): the flash-attention schedule of one
loop/attention.py `Attention` statement.

A block takes BLOCK_M queries of one batch point; ROW_THREADS threads share each query, thread
g owning the head-dim elements d = g + ROW_THREADS * u of q and e = g + ROW_THREADS * u of the
output accumulator (registers). The keys are walked BLOCK_N at a time: the block stages that
block of K and V (operand prologues included, zero past Lk and past the head dim) in shared
memory, each query's group computes its BLOCK_N scores (partial dot products, then a butterfly
of warp shuffles), applies x (scale, masks), and does the online-softmax step: new running max,
rescale of the running sum and the accumulator by exp(m_old - m_new), accumulate p @ V.
After the last block out = acc / l. Nothing of size Lq x Lk is ever stored.

Causal x (loop/attention.py `causal_limit`: -inf past key i + c) stops each query block's key
loop at its last row's limit, and only blocks that cross the diagonal (or Lk) pay for the masks
and bounds: the loop runs in two parts, full blocks without guards, then the edge blocks.

Split-KV (flash-decoding): when the query blocks are too few to fill the GPU (decode: one query
per (batch, head)), KV_SPLITS blocks share each query block's keys, each writing its partial
(max, sum, acc) to a temp buffer, and a second kernel (`CombineTile`) merges them exactly:
out = sum_s acc_s exp(m_s - M) / sum_s l_s exp(m_s - M), M = max_s m_s.

Knobs: BLOCK_M, BLOCK_N, ROW_THREADS (a power of two up to 32; BLOCK_M * ROW_THREADS is a
multiple of 32 and at most 1024), KV_SPLITS (default from tile/split.py's rule, only when the
queries fit one block; any value from 1 to the number of key blocks).

INSTR=mma|fma: "mma" (the default for f16/bf16 q, k, v on sm_80+) is the FlashAttention-2
schedule on tensor cores (kernel_ir/lower_attention_mma.py): one warp per 16 rows, BLOCK_M and
BLOCK_N multiples of 16, ROW_THREADS unused; S = Q K^T and O += P V by mma.sync m16n8k16, the
online softmax on the accumulator fragments. "fma" is the CUDA-core schedule above, taken for
fp32, older targets, a pinned ROW_THREADS or a BLOCK_M/BLOCK_N that is not a multiple of 16,
and tiles that do not fit shared memory (the reason is logged; pinning INSTR=mma there is an
error). The tile kernel records INSTR=mma, or ROW_THREADS for fma.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import lcm, prod

from ..core import dtypes
from ..core.context import Context
from ..core.errors import KnobError
from ..core.expr import Var, add, free_vars, mul, substitute
from ..loop.attention import Attention, CausalLimit, attention_of, causal_limit
from ..loop.ir import BufferInfo, Let, Load, format_stmt
from .ir import TileKernel, subst_body
from .split import choose_pieces

KV_MIN = 64                 # the fewest keys worth a split of their own
COMBINE_BLOCK = 128         # threads per block of the combine kernel (one per output element)


def _pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class AttentionTile:
    op: Attention
    block_m: int
    block_n: int
    row_threads: int
    kv_splits: int = 1
    causal: CausalLimit | None = None
    partials: tuple[str, str] | None = None     # (ml, acc) temp buffers when kv_splits > 1
    group: int = 1                  # query heads per block sharing one K/V tile (GQA)
    head: str | None = None         # the batch axis of those heads when group > 1
    instr: str = "fma"              # "mma"/"wgmma": tensor cores, one warp per 16 rows
                                    # (lower_attention_mma.py, lower_attention_wgmma.py)
    kv_stages: int = 1              # wgmma: K/V buffers in dynamic shared memory (2: pipelined)
    points: int = 0                 # "cpu" (tile/passes/cpu_attention.py): a register tile's columns
    tile_rows: int = 4              # "cpu": a register tile's rows

    def format(self, k, out: list[str]) -> None:     # as tile/ir.py's format_kernel asks
        format_attention_tile(k, out)

    @property
    def q_per_block(self) -> int:
        """Queries of one head per block: BLOCK_M rows are GQA_GROUP heads x these."""
        return self.block_m // self.group

    @property
    def d_per_thread(self) -> int:
        return -(-self.op.d[1] // self.row_threads)

    @property
    def e_per_thread(self) -> int:
        return -(-self.op.e[1] // self.row_threads)

    @property
    def d2_per_thread(self) -> int:
        return -(-self.op.d2[1] // self.row_threads) if self.op.d2 else 0

    @property
    def m_blocks(self) -> int:
        return -(-self.op.i[1] // self.q_per_block)

    @property
    def key_blocks(self) -> int:
        return -(-self.op.j[1] // self.block_n)

    @property
    def split_blocks(self) -> int:
        """Key blocks per split (the last split may get fewer, or none)."""
        return -(-self.key_blocks // self.kv_splits)

    @property
    def rows(self) -> int:
        return prod(n for _, n in self.op.batch) * self.op.i[1]

    @property
    def grid(self) -> int:
        return prod(n for _, n in self.op.batch) // self.group * self.m_blocks * self.kv_splits

    @property
    def block(self) -> int:
        if self.instr.startswith("cpu"):
            return 1
        if self.instr != "fma":
            return self.block_m // 16 * 32
        return self.block_m * self.row_threads

    def smem_bytes(self) -> int:
        if self.instr == "wgmma":   # Q padded as mma's; K and V in 64-column swizzled rows
            dp, bn = ceil16(self.op.d[1]), self.block_n
            k, v = ceil64(self.op.d[1]), ceil64(self.op.e[1])
            return (self.block_m * (dp + MMA_PAD) + self.kv_stages * bn * (k + v)) * 2 \
                + 2 * WGMMA_ALIGN
        if self.instr == "mma":     # Q, K and V tiles, rows padded by MMA_PAD (P: in registers)
            dp, ep = ceil16(self.op.d[1]), ceil16(self.op.e[1])
            bm, bn = self.block_m, self.block_n
            elems = bm * (dp + MMA_PAD) + bn * (dp + MMA_PAD) + bn * (ep + MMA_PAD)
            if self.op.d2:          # the sum form's second score: its Q2 and K2 tiles
                elems += (bm + bn) * (ceil16(self.op.d2[1]) + MMA_PAD)
            return elems * dtypes.ITEMSIZE[self.op.q.dtype]
        g = self.row_threads
        k = self.block_n * self.d_per_thread * g * dtypes.ITEMSIZE[self.op.k.dtype]
        v = self.block_n * self.e_per_thread * g * dtypes.ITEMSIZE[self.op.v.dtype]
        k2 = self.block_n * self.d2_per_thread * g * dtypes.ITEMSIZE[self.op.k2.dtype] \
            if self.op.k2 is not None else 0
        return k + v + k2


def kv_head_group(op: Attention) -> tuple[str, int] | None:
    """(head axis h, rep): query heads rep * g .. rep * g + rep - 1 read the same K and V (GQA),
    proved by substituting h = rep * g + r into the K and V operands: r must drop out."""

    def names(o, mapping, bounds) -> set:
        out = free_vars(substitute(o.value, mapping, bounds))
        for st in subst_body(o.body, mapping, bounds):
            if isinstance(st, Load):
                out |= set().union(*(free_vars(e) for e in st.index))
                out |= free_vars(st.pred) if st.pred is not None else set()
            elif isinstance(st, Let):
                out |= free_vars(st.value)
        return out
    for h, n in op.batch:
        for rep in range(n, 1, -1):
            if n % rep:
                continue
            mapping = {h: add(mul(Var("gqa_g"), rep), Var("gqa_r"))}
            bounds = {"gqa_g": n // rep, "gqa_r": rep}
            if all("gqa_r" not in names(o, mapping, bounds) for o in (op.k, op.v)):
                return h, rep
    return None


def choose_group(op: Attention, g: int, ctx: Context, name: str) -> tuple[int, str | None]:
    """GQA_GROUP: query heads per block sharing K/V tiles. Default: the whole KV head group
    (a power of two) when its short query rows fit one block of at most 256 threads (decode)."""
    gh = kv_head_group(op)
    pinned = ctx.knob("GQA_GROUP", 0)
    if pinned:
        if pinned > 1 and (gh is None or gh[1] % pinned):
            raise KnobError(f"GQA_GROUP={pinned}: must divide the query heads per KV head "
                            f"({gh[1] if gh else 1})")
        return pinned, gh[0] if pinned > 1 else None
    if gh is None:
        return 1, None
    rep = gh[1]
    if rep & (rep - 1) or rep * _pow2_ceil(op.i[1]) * g > 256:
        ctx.log(f"tile_attention: {name}: GQA_GROUP declined, {rep} heads x {op.i[1]} queries "
                f"do not fit one block (or {rep} is not a power of two)")
        return 1, None
    return rep, gh[0]


def default_schedule(op: Attention) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, ROW_THREADS): about 4 head-dim elements per thread, 256 threads a
    block (fewer for short queries: a decode row is one warp), 32 keys a step."""
    g = min(32, _pow2_ceil(-(-op.d[1] // 4)))
    lq = op.i[1]
    block_m = max(32 // g, min(_pow2_ceil(lq), 256 // g))
    return block_m, 32, g


@dataclass(frozen=True)
class CombineTile:
    """The second kernel of split-KV: one thread per output element merges the partials."""
    op: Attention
    kv_splits: int
    partials: tuple[str, str]
    block: int

    @property
    def rows(self) -> int:
        return prod(n for _, n in self.op.batch) * self.op.i[1]

    @property
    def grid(self) -> int:
        return -(-self.rows * self.op.e[1] // self.block)

    def format(self, k, out: list[str]) -> None:     # as tile/ir.py's format_kernel asks
        _format_combine(k, out)


def choose_kv_splits(op: Attention, at: AttentionTile, ctx: Context, name: str) -> int:
    """KV_SPLITS: pinned, or tile/split.py's rule over the key blocks when the queries fit one
    block (decode); prefill (several query blocks) is not split by default."""
    pinned = ctx.knob("KV_SPLITS", 0)
    if op.norm == "sum" or op.lse:
        if pinned > 1:
            raise KnobError(f"KV_SPLITS={pinned}: the sum form and a log-sum-exp output have no "
                            f"split combine; only 1")
        return 1
    if pinned:
        if not 1 <= pinned <= at.key_blocks:
            raise KnobError(f"KV_SPLITS={pinned}: must be from 1 to the {at.key_blocks} key "
                            f"blocks of {at.block_n}")
        return pinned
    blocks = at.grid
    if at.m_blocks > 1:
        ctx.log(f"tile_attention: {name}: KV_SPLITS declined, {at.m_blocks} query blocks "
                f"(prefill) are not split")
        return 1
    splits, why = choose_pieces(at.key_blocks, blocks, ctx, "KV_SPLITS",
                                -(-KV_MIN // at.block_n), "query blocks")
    if splits == 1:
        ctx.log(f"tile_attention: {name}: KV_SPLITS declined, {why}")
    return splits


MMA_DTYPES = ("f16", "bf16")
MMA_PAD = 8                 # elements of row padding of every shared tile of the mma path (16 bytes)


def ceil16(n: int) -> int:
    """A head dim rounded up to the 16 of an mma.sync k-step."""
    return -(-n // 16) * 16

MMA_MAX_HEAD_DIM = 256
WGMMA_ALIGN = 1024          # bytes: a swizzled wgmma operand's shared array starts on this boundary


def ceil64(n: int) -> int:
    """A head dim rounded up to the 64 of one 128-byte swizzled row (wgmma's K and V tiles)."""
    return -(-n // 64) * 64


def mma_decline(op: Attention, ctx: Context) -> str | None:
    """Why the tensor-core path (lower_attention_mma.py) cannot take this attention, or None."""
    if not ctx.arch.has("mma.sync"):
        return f"target {ctx.arch} has no mma.sync (sm_80+)"
    kinds = tuple(o.dtype for o in (op.q, op.k, op.v, op.q2, op.k2) if o is not None)
    if len(set(kinds)) != 1 or kinds[0] not in MMA_DTYPES:
        return f"q, k, v are {'/'.join(kinds)}, not all f16 or all bf16"
    if max(op.d[1], op.e[1], op.d2[1] if op.d2 else 0) > MMA_MAX_HEAD_DIM:
        return f"head dims {op.d[1]}, {op.e[1]} > {MMA_MAX_HEAD_DIM}"
    if "ROW_THREADS" in ctx.knobs:
        return "ROW_THREADS is pinned (a CUDA-core knob)"
    for name in ("BLOCK_M", "BLOCK_N"):
        if name in ctx.knobs and ctx.knob(name, 0) % 16:
            return f"{name}={ctx.knob(name, 0)} is not a multiple of 16"
    return None


def choose_instr(op: Attention, ctx: Context, name: str) -> str:
    """INSTR: "mma" (tensor cores, FlashAttention-2 style) by default for f16/bf16 on sm_80+,
    "fma" (CUDA cores, fp32 math) otherwise; pinning mma where it cannot run is an error."""
    pinned = ctx.knob("INSTR", "")
    if pinned == "wgmma":
        why = mma_decline(op, ctx) or wgmma_decline(op, ctx)
        if why is None:
            return "wgmma"
        raise KnobError(f"INSTR=wgmma: {why}")
    if pinned == "fma":
        return "fma"
    why = mma_decline(op, ctx)
    if why is None:
        return "mma"
    if pinned == "mma":
        raise KnobError(f"INSTR=mma: {why}")
    ctx.log(f"tile_attention: {name}: INSTR=mma declined, {why}")
    return "fma"


def wgmma_decline(op: Attention, ctx: Context) -> str | None:
    """Why the wgmma path (lower_attention_wgmma.py, pinned by INSTR=wgmma) cannot take this
    attention beyond mma's reasons, or None."""
    if not ctx.arch.has("wgmma"):
        return f"target {ctx.arch} has no wgmma (sm_90a)"
    if op.norm == "sum" or op.d2:
        return "a backward's sum form runs on mma.sync"
    if ctx.knob("BLOCK_M", 64) % 64:
        return f"BLOCK_M={ctx.knob('BLOCK_M', 64)} is not whole warpgroups of 64 rows"
    return None


def mma_schedule(op: Attention, ctx: Context, name: str, instr: str = "mma") -> AttentionTile | None:
    """BLOCK_M (a multiple of 16: one warp per 16 rows; of 64 for wgmma's warpgroups), BLOCK_N
    (a multiple of 16) for the tensor-core paths; None (with a logged reason) when no such
    schedule fits and INSTR is not pinned."""
    pinned = ctx.knob("INSTR", "") == instr
    rows = 64 if instr == "wgmma" else 16

    def decline(why: str):
        if pinned:
            raise KnobError(f"INSTR={instr}: {why}")
        ctx.log(f"tile_attention: {name}: INSTR=mma declined, {why}")
        return None
    group, head = choose_group(op, 2, ctx, name)
    lq, lk = op.i[1], op.j[1]
    bm = max(16, group * _pow2_ceil(lq)) if group > 1 else min(64, max(16, _pow2_ceil(lq)))
    if instr == "wgmma":        # whole warpgroups; K and V in dynamic shared memory
        bm = -(-bm // lcm(rows, group)) * lcm(rows, group)
    wide = 64 if ceil16(op.d[1]) <= 64 or instr == "wgmma" else 32
    bn = min(wide, max(16, ceil16(lk)))
    bm, bn = ctx.knob("BLOCK_M", bm), ctx.knob("BLOCK_N", bn)
    if bm % rows or bm % group or bm > 512 or bn % 16 or bn < 16:
        return decline(f"BLOCK_M={bm}, BLOCK_N={bn}: need multiples of 16 (BLOCK_M of {rows} "
                       f"and of GQA_GROUP={group}), BLOCK_M at most 512")
    at = AttentionTile(op, bm, bn, 1, group=group, head=head, instr=instr)
    limit = ctx.arch.smem_optin if instr == "wgmma" else ctx.arch.smem_per_block
    if instr == "wgmma" and replace(at, kv_stages=2).smem_bytes() <= limit // 2:
        at = replace(at, kv_stages=2)       # two blocks an SM still fit
    while at.smem_bytes() > limit and "BLOCK_N" not in ctx.knobs and at.block_n > 16:
        at = replace(at, block_n=at.block_n // 2 // 16 * 16 or 16)
    while at.smem_bytes() > limit and "BLOCK_M" not in ctx.knobs \
            and at.block_m > rows and (at.block_m // 2) % lcm(rows, group) == 0:
        at = replace(at, block_m=at.block_m // 2)
    splits = ctx.knob("KV_SPLITS", 0)
    while splits > at.key_blocks and "BLOCK_N" not in ctx.knobs and at.block_n > 16:
        at = replace(at, block_n=at.block_n // 2 // 16 * 16 or 16)
    if splits > at.key_blocks:
        return decline(f"KV_SPLITS={splits} > the {at.key_blocks} key blocks of {at.block_n}")
    if at.smem_bytes() > limit:
        return decline(f"the Q, K and V tiles need {at.smem_bytes()} bytes of shared memory "
                       f"(more than {limit})")
    return at


def tile_attention(k, ctx: Context, buffers: tuple):
    """The first tile pass: a fused attention kernel gets its schedule here (the block of
    queries, the key step, the threads per query and the KV splits, as knobs, checking what the
    hardware allows): one kernel, or two (the split kernel and its combine) when KV_SPLITS > 1.
    Any other kernel passes through to tileify."""
    op = attention_of(k)
    if op is None:
        return k
    instr = choose_instr(op, ctx, k.name)
    if instr != "fma":
        at = mma_schedule(op, ctx, k.name, instr)
        if at is not None:
            return _finish(k, ctx, buffers, at)
    bm, bn, g = default_schedule(op)
    g = ctx.knob("ROW_THREADS", g)
    group, head = choose_group(op, g, ctx, k.name)
    if group > 1:
        bm = max(32 // g, group * _pow2_ceil(op.i[1]))
    bm, bn = ctx.knob("BLOCK_M", bm), ctx.knob("BLOCK_N", bn)
    if bm % group:
        raise KnobError(f"BLOCK_M={bm}: must be a multiple of GQA_GROUP={group}")
    if (bm * g) % 32 or bm * g > 1024:
        raise KnobError(f"BLOCK_M={bm}, ROW_THREADS={g}: the block of BLOCK_M * ROW_THREADS "
                        f"threads must be a multiple of 32 and at most 1024")
    at = AttentionTile(op, bm, bn, g, group=group, head=head)
    if "BLOCK_N" not in ctx.knobs:
        while at.smem_bytes() > ctx.arch.smem_per_block and at.block_n > 1:
            at = replace(at, block_n=at.block_n // 2)
    if at.smem_bytes() > ctx.arch.smem_per_block:
        raise KnobError(f"BLOCK_N={at.block_n}: the K and V tiles need {at.smem_bytes()} bytes "
                        f"of shared memory (more than {ctx.arch.smem_per_block})")
    return _finish(k, ctx, buffers, at)


def _finish(k, ctx: Context, buffers: tuple, at: AttentionTile):
    """The KV splits, the causal bound and the kernel(s) of a chosen schedule."""
    op, g, group = at.op, at.row_threads, at.group
    splits = choose_kv_splits(op, at, ctx, k.name)
    causal = causal_limit(op)
    threads = f"one warp per 16 queries ({at.instr})" if at.instr != "fma" else f"{g} threads per query"
    ctx.log(f"tile_attention: {k.name}: {at.block_m} queries x {at.block_n} keys per step, "
            f"{threads}, {splits} KV splits, {group} query heads per K/V tile"
            + (f", keys {'from' if causal.lower else 'up to'} "
               f"{causal.loaded.buf if causal.loaded else 'query'} + {causal.offset} (causal)"
               if causal else ""), 2)
    domain = (*op.batch, op.i)
    knobs = (("BLOCK_M", at.block_m), ("BLOCK_N", at.block_n), ("KV_SPLITS", splits),
             ("GQA_GROUP", group))
    knobs += (("INSTR", at.instr),) if at.instr != "fma" else (("ROW_THREADS", g),)
    if at.instr == "fma" and ctx.pinned("INSTR"):      # a pinned INSTR shows what ran
        knobs += (("INSTR", "fma"),)
    if splits == 1:
        at = replace(at, causal=causal)
        tk = TileKernel(k.name, "attention", domain, (), (), block=at.block, reads=k.reads,
                        writes=k.writes, buffers=buffers, attention=at, src=k.src)
        return _with_knobs(tk, knobs)
    ml = BufferInfo(f"{k.name}_ml", (splits, at.rows, 2), "f32", "temp")
    acc = BufferInfo(f"{k.name}_acc", (splits, at.rows, op.e[1]), "f32", "temp")
    at = replace(at, kv_splits=splits, causal=causal, partials=(ml.name, acc.name))
    ins = tuple(b for b in buffers if b.name in k.reads)
    first = TileKernel(f"{k.name}_splitkv", "attention", domain, (), (), block=at.block,
                       reads=k.reads, writes=(ml.name, acc.name), buffers=ins + (ml, acc),
                       attention=at, src=k.src)
    comb = CombineTile(op, splits, (ml.name, acc.name), COMBINE_BLOCK)
    outs = tuple(b for b in buffers if b.name in k.writes)
    second = TileKernel(f"{k.name}_combine", "attention", domain + (op.e,), (), (),
                        block=comb.block, reads=(ml.name, acc.name), writes=k.writes,
                        buffers=(ml, acc) + outs, attention=comb, src=k.src)
    return _with_knobs(first, knobs), second.with_knob("KV_SPLITS", splits)


def _with_knobs(tk: TileKernel, knobs) -> TileKernel:
    for name, value in knobs:
        tk = tk.with_knob(name, value)
    return tk


def format_attention_tile(k: TileKernel, out: list[str]) -> None:
    at = k.attention
    op, g = at.op, at.row_threads
    if at.instr.startswith("cpu"):
        return _format_cpu(k, out)
    axes = ", ".join(f"{v}:{n}" for v, n in op.batch) + f", {op.i[0]}:{op.i[1]}=M"
    split = f" x {at.kv_splits}=KV_SPLIT" if at.kv_splits > 1 else ""
    per = f"{at.block_m}/BLOCK"
    if at.group > 1:
        per = f"({at.head}: {at.group} heads sharing K/V) x {at.q_per_block}/BLOCK"
    if at.instr == "mma":
        out.append(f"Tile(attention=({axes.lstrip(', ')}) = {per}{split}, w:{at.block_m // 16}"
                   f"=WARP x 16 QUERIES, grid={k.grid}, block={k.block}):")
        out.append(f"    # INSTR=mma: Q, K, V tiles {op.q.dtype} in shared memory, S = q @ k_smem^T "
                   f"and acc += p @ v_smem by mma.sync m16n8k16 (f32 accumulators), the softmax "
                   f"on the fragments")
    elif at.instr == "wgmma":
        out.append(f"Tile(attention=({axes.lstrip(', ')}) = {per}{split}, w:{at.block_m // 16}"
                   f"=WARP x 16 QUERIES, grid={k.grid}, block={k.block}):")
        out.append(f"    # INSTR=wgmma: K, V tiles {op.q.dtype} in 128-byte swizzled rows, S = q @ "
                   f"k_smem^T and acc += p @ v_smem by wgmma m64 (A = q's and p's fragments in "
                   f"registers), the softmax on the fragments")
    else:
        out.append(f"Tile(attention=({axes.lstrip(', ')}) = {per}{split}, t:{at.block_m}x{g}"
                   f"=QUERY x THREAD, grid={k.grid}, block={k.block}):")
    i, j, d, e = op.i[0], op.j[0], op.d[0], op.e[0]
    mma = at.instr != "fma"
    out.append(f"    q = SmemTile(q[{i}:{at.block_m}, {d}] {op.q.dtype}) -> A fragments (ldmatrix, once):"
               if mma else f"    q = Registers(q[{i}, {d} = t + {g} * u], {at.d_per_thread} per thread):")
    for s in op.q.body:
        format_stmt(s, 2, out)
    if op.q2 is not None:
        out.append(f"    q2 = Registers(q2[{i}, {op.d2[0]} = t + {g} * u], {at.d2_per_thread} per thread):")
        for s in op.q2.body:
            format_stmt(s, 2, out)
    if op.norm == "sum":
        out.append(f"    acc = Registers(acc[{e} = t + {g} * u] 0; {at.e_per_thread} per thread)")
    else:
        out.append(f"    m, l, acc = Registers(max -inf, sum 0, acc[{i}:16 per warp, {e}] 0 as f32 C "
                   f"fragments)" if mma else f"    m, l, acc = Registers(max -inf, sum 0, acc[{e} = t + "
                   f"{g} * u] 0; {at.e_per_thread} per thread)")
    keys = _keys(at)
    if at.kv_splits > 1:
        keys = f"split * {at.split_blocks}..min(+{at.split_blocks}, {at.key_blocks})" + \
            keys[len(f"0..{at.key_blocks}"):]
    out.append(f"    for {j}_o in {keys}:  # key blocks of {at.block_n}")
    staged = [("k", op.k, op.d), ("v", op.v, op.e)] + ([("k2", op.k2, op.d2)] if op.k2 else [])
    for name, o, (ax, n) in staged:
        out.append(f"        {name}_smem = StageTile({name}[{j}:{at.block_n}, {ax}:"
                   f"{-(-n // g) * g}] {o.dtype}, 0 past {op.j[1]}):")
        for s in o.body:
            format_stmt(s, 3, out)
    out.append("        Sync")
    out.append(f"        {op.score}[16 per warp, {at.block_n}] = mma(q, k_smem^T)  # f32 C fragments"
               if mma else f"        {op.score}[{at.block_n}] = Combine(sum over {d} of q * k_smem, threads={g})")
    if op.q2 is not None:
        out.append(f"        {op.score2}[{at.block_n}] = Combine(sum over {op.d2[0]} of q2 * k2_smem, "
                   f"threads={g})")
    out.append(f"        x[{at.block_n}] = {'0' if op.norm == 'sum' else '-inf'} past {op.j[1]}, else:")
    for s in op.x.body:
        format_stmt(s, 3, out)
    if op.norm == "sum":
        out.append("        acc = acc + x @ v_smem")
        out.append("        Sync")
        out.append(f"    {op.out}[{', '.join(str(x) for x in op.out_index)}] = acc")
        return
    out.append("        m_new = max(m, max(x)); c = exp(m - m_new); p = exp(x - m_new)  "
               "# -inf - -inf counts as 0")
    if mma:
        out.append(f"        p = packed to {op.q.dtype} pairs in registers (its C fragments are "
                   f"P @ V's A fragments)")
    out.append("        l = l * c + sum(p); acc = acc * c + p @ v_smem; m = m_new" +
               ("  # mma, v_smem by ldmatrix.trans" if mma else ""))
    out.append("        Sync")
    if at.kv_splits > 1:
        ml, acc = at.partials
        row = ", ".join([v for v, _ in op.batch] + [i])
        out.append(f"    {ml}[split, {row}] = (m, l); {acc}[split, {row}, {e}] = acc")
        return
    zero = "0 where m == -inf, else " if op.safe else ""
    out.append(f"    {op.out}[{', '.join(str(x) for x in op.out_index)}] = {zero}acc / l")
    if op.lse:
        out.append(f"    {op.lse[0]}[{', '.join(str(x) for x in op.lse[1])}] = m + log(l)")


def _keys(at) -> str:
    """The key blocks a query block walks, as --ir tile says it."""
    i, c = at.op.i[0], at.causal
    keys = f"0..{at.key_blocks}"
    if c and c.loaded:
        return keys + (f", up to {c.loaded.buf}[{', '.join(map(str, c.loaded.index))}] + "
                       f"{c.offset} (loaded once); full blocks first ({c.cond} = {c.keep}), then the edge blocks")
    if c and c.lower:
        return keys + f", from the block's first {i} + {c.offset}, every block masked ({c.cond})"
    if c:
        return keys + (f", up to the block's last {i} + {c.offset}; full blocks first (no masks or "
                       f"bounds, {c.cond} = {c.keep}), then the diagonal and tail blocks")
    return keys + "; full blocks first (no bounds), then the tail block"


def _format_cpu(k: TileKernel, out: list[str]) -> None:
    at = k.attention
    op, bm, bn = at.op, at.block_m, at.block_n
    (i, _), (j, lk), (d, _), (e, _) = op.i, op.j, op.d, op.e
    bf16 = at.instr == "cpu-bf16"
    dt, form = ("bf16", "vdpbf16ps on pairs of K (FORM=pairs)") if bf16 else ("f32", "FMAs (FORM=outer)")
    axes = ", ".join(f"{v}:{n}" for v, n in (*op.batch, op.i))
    out.append(f"Tile(attention=({axes}) = {bm}/BLOCK, one thread a block, grid={k.grid}):")
    out.append(f"    q_s = Scratch(q[{i}:{bm}, {d}] {dt}, {d} outer{' in pairs' if bf16 else ''}, 0 past "
               f"{op.i[1]}):")
    for s in op.q.body:
        format_stmt(s, 2, out)
    out.append(f"    m, l, o_s = Scratch(max -inf, sum 0, o[{i}:{bm}, {e}] 0{', transposed' if bf16 else ''})")
    out.append(f"    for {j}_o in {_keys(at)}:  # key blocks of {bn}")
    for name, o, ax in (("k_s", op.k, f"{j}:{bn}, {d}"), ("v_s", op.v, f"{e}, {j}:{bn}" if bf16 else f"{j}:{bn}, {e}")):
        out.append(f"        {name} = Scratch({name[0]}[{ax}] {dt}, 0 past {lk}):")
        for s in o.body:
            format_stmt(s, 3, out)
    out.append(f"        st_s[{bn}, {bm}] = k_s @ q_s  # the scores transposed; register tiles of "
               f"{at.tile_rows} x {at.points}, {form}")
    out.append(f"        x = -inf past {lk}, else:")
    for s in op.x.body:
        format_stmt(s, 3, out)
    out.append("        m_new = max(m, max over keys of x); c = exp(m - m_new); p = exp(x - m_new)  "
               "# along vectors of queries; -inf - -inf counts as 0")
    out.append(f"        l = l * c + sum(p); o_s = o_s * c + p @ v_s  # register tiles of "
               f"{at.tile_rows} x {at.points}; m = m_new")
    zero = "0 where m == -inf, else " if op.safe else ""
    out.append(f"    {op.out}[{', '.join(str(x) for x in op.out_index)}] = {zero}o_s / l")
    if op.lse:
        out.append(f"    {op.lse[0]}[{', '.join(str(x) for x in op.lse[1])}] = m + log(l)")


def _format_combine(k: TileKernel, out: list[str]) -> None:
    c = k.attention
    op = c.op
    ml, acc = c.partials
    axes = ", ".join(f"{v}:{n}" for v, n in k.domain)
    out.append(f"Tile(elementwise=({axes}), grid={k.grid}, block={k.block}):")
    row = ", ".join([v for v, _ in op.batch] + [op.i[0]])
    out.append(f"    M = max over s < {c.kv_splits} of {ml}[s, {row}].m")
    out.append(f"    w_s = exp(m_s - M)  # M == -inf counts as 0")
    zero = "0 where M == -inf, else " if op.safe else ""
    out.append(f"    {op.out}[{', '.join(str(x) for x in op.out_index)}] = {zero}"
               f"sum_s {acc}[s, {row}, {op.e[0]}] * w_s / sum_s l_s * w_s")
