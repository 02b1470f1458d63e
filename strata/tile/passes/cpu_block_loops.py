"""cpu_block_loops: a loop whose indices work in blocks (`k // c`, `k % c`) runs as blocks.

Why: a block-quantized weight (strata/quant: 32 weights share one scale) is read at
`qs[row, k // 32, k % 32]` with its scale at `d[row, k // 32]`. As one loop over k every
iteration divides and the C compiler vectorises nothing: a q8_0 GEMV of 5632 x 2048 took 33 ms
where bf16 took 0.6 ms. Split into k_o (the blocks) and k_i (c long, innermost), the indices are
affine (k_o * c + k_i), the scale is the same all through the inner loop, and the inner loop reads
c contiguous elements, which the compiler vectorises.

A loop is split when some index or value in its body divides or takes the remainder of its
variable by a constant c (2 <= c < extent) that divides the extent, once simplified (a head
split and joined again, `k // 64 * 64 + k % 64`, is k); blocks inside blocks (a K-quant's 32
weights inside its super-block of 256: `k // 256` and `k // 32`) split by the smallest, the
larger becoming an index of the block (k_o // 8); sizes that do not nest decline, saying so. A float sum over the split loop adds into c partial sums (a scratch row, one
per inner position) that are added up after it: summed into one variable, each inner loop would
end in a horizontal vector sum (that GEMV: 4.4 ms so, 1.9 ms with the partial sums). Other
accumulators stay on the outer loop, set once. BLOCK_LOOPS=0 leaves the loops whole. A row of
quantized blocks gets QDOT=vnni where the CPU has AVX512-VNNI or AVX2 without AVX-512 (vpmaddubsw)
and the row writes or rounds its weights to bf16 or fp16 (the last down projection, fused into the
final norm's upcast, writes f32; c_qdot.py: int8 activations err about as much as 16-bit floats,
0.6% of the norm; fp32 rows keep the float lanes unless QDOT is pinned).
"""
from __future__ import annotations

from dataclasses import replace

from ...core import dtypes
from ...core.context import Context
from ...core.expr import Cast, Const, Op, Var, add, call, free_vars, mul, nodes, simplify
from ...loop.ir import Accum, Let, Load, Loop, Store
from ..contraction import divisors
from ..ir import Mode, Scratch, TileKernel, flat_index, map_body, subst_body, walk


HALF = ("bf16", "f16")      # a row rounding its weights to these is a 16-bit model's (docstring)


def cpu_block_loops(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode is not Mode.ROWS:
        return k
    if not ctx.knob("BLOCK_LOOPS", 1):
        return k.with_knob("BLOCK_LOOPS", 0)
    split, scratch, rows = [], [], []

    def shape_of(buf):              # a loop around a split one reads its lanes' scratch too
        return next(((x.size,) for x in scratch if x.name == buf), None) or k.shape_of(buf)

    def fn(s):
        if not isinstance(s, Loop):
            return s
        sizes = {c for e in _exprs(s.body, shape_of) for c in divisors(simplify(e), s.var)}
        sizes = {c for c in sizes if 2 <= c < s.extent and s.extent % c == 0}
        if not sizes:
            return s
        c = min(sizes)
        if any(b % c for b in sizes):
            ctx.log(f"cpu_block_loops: {k.name}: declined, loop {s.var} has blocks of "
                    f"{sorted(sizes)}")
            return s
        outer, inner = f"{s.var}_o", f"{s.var}_i"
        body = subst_body(s.body, {s.var: add(mul(Var(outer), c), Var(inner))},
                          {outer: s.extent // c, inner: c})
        split.append(f"{s.var} in {s.extent // c} blocks of {c}")
        once, body = _per_block(body, inner)
        if _lane_sums(s):
            if any(isinstance(x, Load) and k.dtype_of(x.buf) in ("i8", "u8") for x in walk(body)):
                rows.append(any(isinstance(n, Cast) and n.dtype in HALF for e in _exprs(body) for n in nodes(e)))
            return _in_lanes(s, outer, inner, c, once, body, scratch)
        return replace(s, var=outer, extent=s.extent // c,
                       body=once + (Loop(inner, c, s.kind, body, unroll=s.unroll),))
    body = map_body(k.body, fn)
    out = replace(k, body=tuple(scratch) + body)
    if split:
        ctx.log(f"cpu_block_loops: {k.name}: {', '.join(split)}", 2)
        out = out.with_knob("BLOCK_LOOPS", 1) if ctx.pinned("BLOCK_LOOPS") else out
    if rows and (all(map(ctx.arch.has, ("avx512_vnni", "avx512bw", "avx512vl"))) or not
                      ctx.arch.has("avx512f") and all(map(ctx.arch.has, ("avx2", "fma", "f16c")))):
        half = all(rows) or all(k.dtype_of(w) in HALF for w in k.writes)     # rows may write f32
        out = out.with_knob("QDOT", ctx.knob("QDOT", "vnni" if half else "float"))
    return out


def _lane_sums(loop: Loop) -> bool:
    """Whether every accumulator of `loop` is a float sum added to only at its body's top level."""
    accums = [s for s in walk(loop.body) if isinstance(s, Accum)]
    return bool(loop.accs) and all(a.op == "sum" and dtypes.is_float(a.dtype) for a in loop.accs) \
        and all(s in loop.body for s in accums)


def _per_block(body, inner: str) -> tuple[tuple, tuple]:
    """(the loads and lets of `body` that are the same for the whole block, such as the block's
    scale and its conversions, moved before the inner loop; the rest)."""
    once, rest, varying = [], [], {inner}
    for s in body:
        if isinstance(s, (Load, Let)) and not (_uses(s) & varying) \
                and not (isinstance(s, Load) and s.pred is not None):
            once.append(s)
        else:
            rest.append(s)
            varying |= {s.var} if isinstance(s, (Load, Let)) else set()
    return tuple(once), tuple(rest)


def _uses(s) -> set:
    exprs = (*s.index, *((s.pred,) if s.pred is not None else ())) if isinstance(s, Load) \
        else (s.value,)
    return set().union(*(free_vars(e) for e in exprs))


def _in_lanes(loop: Loop, outer: str, inner: str, c: int, once, body, scratch: list) -> tuple:
    """zero the lanes; for outer: for inner: lane[inner] += value; then acc = sum of the lanes."""
    lane = {a.acc: f"{a.acc}_lanes" for a in loop.accs}
    dtype = {a.acc: a.dtype for a in loop.accs}
    scratch += [Scratch(lane[a], dtype[a], c) for a in lane]
    at = (Var(inner),)

    def add_to_lane(s):
        if not isinstance(s, Accum):
            return (s,)
        old = Var(f"{s.acc}_lane", dtype[s.acc])
        if isinstance(s.value, Op) and s.value.op == "multiply":      # one fma, as an Accum
            new = call("fma", *s.value.args, old)
        else:
            new = call("add", old, s.value)
        return (Load(old.name, lane[s.acc], at, dtype[s.acc]), Store(lane[s.acc], at, new))
    summed = tuple(x for s in body for x in add_to_lane(s))
    zero = Loop(inner, c, "free", tuple(Store(lane[a], at, Const(0, dtype[a])) for a in lane))
    blocks = Loop(outer, loop.extent // c, "free", once + (Loop(inner, c, "free", summed),))
    total = Loop(inner, c, "reduce", tuple(
        x for a in lane for x in (Load(f"{a}_lane", lane[a], at, dtype[a]),
                                  Accum(a, "sum", Var(f"{a}_lane", dtype[a])))), accs=loop.accs)
    return (zero, blocks, total)


def _exprs(body, shape_of=None):
    """Every expression of body; with shape_of, a load's or store's index as one flat offset."""
    def index(s):
        return (flat_index(s.index, shape_of(s.buf)),) if shape_of else s.index
    for s in walk(body):
        if isinstance(s, Load):
            yield from index(s)
            if s.pred is not None:
                yield s.pred
        elif isinstance(s, (Let, Accum)):
            yield s.value
        elif isinstance(s, Store):
            yield from index(s)
            yield s.value
