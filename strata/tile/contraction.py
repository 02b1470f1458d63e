"""Recognise a contraction in a rows kernel: its M and N axes and the two operands of each
reduce loop. Used by the matmul passes (split_matmul_k, tile_matmul, stage_matmul_tiles, the tensor-core
ones), with the block-tile rules they share (tile sizes, edge guards).

A row qualifies when its statements are scalar statements and reduce loops (nothing else), and
every reduce loop accumulates the `sum` of one float product `a * b` in which `a` (prologue
included) does not depend on the N axis and `b` not on the M axis. M is an axis only `a` reads,
N one only `b` reads (the innermost such, in domain order); every other axis is a batch axis,
fixed per block. With no axis of its own on one side the row is a vector-matrix product and M
is None (a decode shape). Statements before a loop that the loop reads are moved into it first
(`sink_into_loops`), so that every loop is self-contained.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..core import dtypes
from ..core.context import Context
from ..core.errors import KnobError
from ..core.expr import Cast, Const, Op, Var, call, children, coefficient, free_vars, to_str
from ..loop.ir import Accum, BufferInfo, Let, Load, Loop, Store
from .ir import MatmulTile, TileKernel, flat_index, rename_stmt, subst_body, walk


@dataclass(frozen=True)
class Contraction:
    m: str | None                        # the M axis: only the M-side operand depends on it
    n: str                               # the N axis: only the N-side operand depends on it
    body: tuple                          # the row body, loop inputs sunk into the loops

    @property
    def loops(self) -> list[Loop]:
        return [s for s in self.body if isinstance(s, Loop)]


def uses(s) -> set[str]:
    """The variables a Loop IR statement reads."""
    if isinstance(s, Load):
        return set().union(*map(free_vars, s.index), free_vars(s.pred) if s.pred is not None else set())
    if isinstance(s, Let):
        return free_vars(s.value)
    if isinstance(s, Accum):
        return free_vars(s.value)
    if isinstance(s, Store):
        return set().union(free_vars(s.value), *map(free_vars, s.index))
    return set()


def depends(body, axes: set[str]) -> dict[str, set[str]]:
    """For each value defined in `body`: the axes among `axes` it depends on, transitively."""
    deps: dict[str, set[str]] = {}
    for s in body:
        if isinstance(s, (Load, Let)):
            deps[s.var] = set().union(*(deps.get(v, {v} & axes) for v in uses(s)))
    return deps


def closure(body, name: str) -> tuple:
    """The statements of `body` that compute `name`, in order."""
    need, out = {name}, []
    for s in reversed(body):
        if isinstance(s, (Load, Let)) and s.var in need:
            need |= uses(s)
            out.append(s)
    return tuple(reversed(out))


def reads(s) -> set[str]:
    """The variables a statement reads from outside itself (for a loop: from outside the loop)."""
    if not isinstance(s, Loop):
        return uses(s)
    inner = {x.var for x in s.body if isinstance(x, (Load, Let))} | {s.var}
    return set().union(*map(reads, s.body)) - inner


def sink_into_loops(body) -> tuple:
    """Move the row statements a reduce loop reads into the top of that loop (copies, renamed
    `<name>_<loop var>`, when something else reads them too)."""
    out = list(body)
    for loop in [s for s in body if isinstance(s, Loop)]:
        pos = next(i for i, s in enumerate(out) if s is loop)
        before = {s.var: s for s in out[:pos] if isinstance(s, (Load, Let))}
        need = _needed(before, reads(loop))
        if not need:
            continue
        chain = [s for s in out[:pos] if isinstance(s, (Load, Let)) and s.var in need]
        rest = [s for s in out if s is not loop and not any(s is c for c in chain)]
        # what the rest still reads, with everything that computes it, stays as well
        shared = need & _needed(before, set().union(*map(reads, rest)))
        names = {v: f"{v}_{loop.var}" for v in shared}
        moved = tuple(rename_stmt(s, names) for s in chain + list(loop.body))
        out = [replace(loop, body=moved) if s is loop else s for s in out
               if not (isinstance(s, (Load, Let)) and s.var in need - shared)]
    return tuple(out)


def _needed(defined: dict, wanted: set[str]) -> set[str]:
    need, todo = set(), [v for v in wanted if v in defined]
    while todo:
        v = todo.pop()
        if v not in need:
            need.add(v)
            todo += [u for u in uses(defined[v]) if u in defined]
    return need


def match(k: TileKernel) -> Contraction | str:
    """The contraction in a rows kernel, or why it is not one."""
    if k.mode != "rows" or k.group != 1:
        return "not a row kernel"
    loops = [s for s in k.body if isinstance(s, Loop)]
    if not loops:
        return "no reduction"
    if any(l.kind != "reduce" or any(isinstance(s, Loop) for s in l.body) for l in loops):
        return "the row holds a loop that is not a flat reduction"
    c = Contraction(None, "", sink_into_loops(k.body))
    axes = {v for v, _ in k.domain}
    found = []
    for loop in c.loops:
        if len(loop.accs) != 1 or loop.accs[0].op != "sum" or not dtypes.is_float(loop.accs[0].dtype):
            return f"{loop.var} is not one floating-point sum"
        ops = product(loop.body)
        if isinstance(ops, str):
            return f"{loop.var}: {ops}"
        found.append((depends(loop.body, axes), *ops))
    deps, a, b, _ = found[0]
    a_only, b_only = deps[a] - deps[b], deps[b] - deps[a]
    if not b_only:
        a_only, b_only = b_only, a_only
    if not b_only:
        return "neither operand has an axis of its own (a dot product)"
    order = [v for v, _ in k.domain]
    m = max(a_only, key=order.index) if a_only else None
    n = max(b_only, key=order.index)
    for loop, (deps, a, b, p) in zip(c.loops, found):
        if not any(n not in deps[x] and m not in deps[y] for x, y in ((a, b), (b, a))):
            return f"the operands of {loop.var} do not split along {m} and {n}"
        both = [v for v, d in deps.items() if v != p and {m, n} <= d]
        if both:
            return f"{both[0]} depends on both {m} and {n} inside the reduction"
    return replace(c, m=m, n=n)


def divisors(e, var: str):
    """The constants c of every `var // c` and `var % c` inside e."""
    if isinstance(e, Op) and e.op in ("floordiv", "mod") and isinstance(e.args[1], Const) \
            and isinstance(e.args[0], Var) and e.args[0].name == var:
        yield int(e.args[1].value)
    for a in children(e):
        yield from divisors(a, var)


def product(body) -> tuple[str, str, str] | str:
    """(a, b, p) for a body that accumulates p = multiply(a, b), a and b computed in it."""
    accums = [s for s in body if isinstance(s, Accum)]
    if len(accums) != 1:
        return f"it accumulates {len(accums)} times per step"
    acc = accums[0]
    lets = {s.var: s for s in body if isinstance(s, Let)}
    p = lets.get(acc.value.name) if isinstance(acc.value, Var) else None
    if p is None or getattr(p.value, "op", None) != "multiply" \
            or not all(isinstance(x, Var) for x in p.value.args):
        return f"it accumulates {to_str(p.value if p else acc.value)}, not a product"
    a, b = (x.name for x in p.value.args)
    defined = {s.var for s in body if isinstance(s, (Load, Let))}
    if a not in defined or b not in defined or a == b:
        return "its product does not read two operands computed in it"
    return a, b, p.var


# ---------------------------------------------------------------- block tiles (CUDA cores)

THREADS = 256                     # threads per block the default tiles aim for
CPU_VECTORS_N = 2                 # SIMD vectors across a CPU register tile's row (cpu_matmul)
WIDE_N = 4                        # ... 4 in the outer form where 32 vector registers hold 6 x 4
                                  # accumulators and its K x 4-vector panel takes at most half of
                                  # L2 or K can run in chunks (cpu_matmul._outer_chunk)
                                  # (codegen/c_outer.py prints it; 2-core EMR, fp32, M=128:
                                  # K=2048, N=5632 1.25x faster than 6 x 2; K=5632 with its 1.4
                                  # MiB panel 0.69x)
DOT_MIN_K = 256                   # the shortest K a bf16 contraction runs in the dot form: at
                                  # M=128, N=2048 it took 0.73x the packed form's time at K=256,
                                  # 1.05x at 128, 1.5x at 64 (the 2-core EPYC, 2026-11-25)
DOT_FEW_M, DOT_FEW_M_MIN_K = 32, 64  # ... unless M is at most 32: then from K = 64 (a decode
                                  # step's q @ k^T over a bf16 cache, GQA's 8 rows, K = 64: 0.35x
                                  # the pairs form's time at 512 keys, 0.51x at 16 rows, 0.78x at
                                  # 32, 1.18x at 64; Zen 4, 2026-11-28)
AMX_MIN_M = 64                    # the fewest rows a bf16 contraction runs on AMX tiles by default:
                                  # linear (2048 -> 5632) took 1.3x dot's time at M=16, 0.9x at 32,
                                  # 0.69x at 64, 0.32x at 128, 0.19x at 512 (2-core EMR, 11-26)
AMX_MIN_K = 32                    # ... and the shortest K (one tdpbf16ps step)
DOT_MAX_M = 64                    # the most rows an f32 contraction runs in the dot form: at
                                  # N=K=2048 it took 0.24x the packed form's time at M=8, 0.55x
                                  # at 32, 0.81x at 64, 0.98x at 96, 1.14x at 128
DOT_MAX_M_16 = 24                 # ... with AVX2's 16 vector registers, which its 2 x 8 fill
                                  # (Zen 3, K=2048, N=5632: 0.50x at 8, 0.93x at 24, 1.38x at 64)


def sides(c: Contraction, loop: Loop) -> tuple[str, str]:
    """(M-side, N-side): the two values a reduce loop of `c` multiplies."""
    a, b, _ = product(loop.body)
    return (b, a) if c.n in depends(loop.body, {c.m, c.n})[a] else (a, b)


def held(loop: Loop) -> str | None:
    """The dtype eager holds a reduce loop's multiplicands in (Accum.operands), if 16-bit."""
    return next(s.operands for s in loop.body if isinstance(s, Accum))


def fp8_rounded(stmts) -> str | None:
    """The FP8 dtype an operand's prologue rounds its value to last (`x.to(float8).float()`:
    FP8Linear's activations), so that storing it in that dtype loses nothing; else None."""
    lets = {s.var: s.value for s in stmts if isinstance(s, Let)}
    last = stmts[-1] if stmts else None
    if isinstance(last, Let) and isinstance(last.value, Cast) and isinstance(last.value.arg, Var):
        inner = lets.get(last.value.arg.name)
        if isinstance(inner, Cast) and inner.dtype in dtypes.FLOAT8:
            return inner.dtype
    return None


def bf16_exact(k: TileKernel, c: Contraction, loop: Loop) -> bool:
    """Whether a reduce loop's multiplicands are bf16 values as computed: eager holds them in
    bf16 (held), or one is FP8 (a load, or a prologue rounding to FP8) and the other FP8 or bf16.
    FP8 values are exact in bf16 and a product of such is exact in f32, so the bf16 forms
    (vdpbf16ps, AMX) round nothing that the f32 product does not (torch._scaled_mm)."""
    if held(loop) == "bf16":
        return True
    kinds = []
    for side in (closure(loop.body, v) for v in sides(c, loop)):
        plain = len(side) == 1 and isinstance(side[0], Load)
        kinds.append(k.dtype_of(side[0].buf) if plain else fp8_rounded(side))
    return all(d in ("bf16", *dtypes.FLOAT8) for d in kinds) and \
        any(d in dtypes.FLOAT8 for d in kinds)


def pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def default_tiles(m: int, n: int) -> tuple[int, int, int, int]:
    """(TILE_M, TILE_N, THREAD_M, THREAD_N): 64x64 tiles of 4x4 points per thread; a short M
    (decode) or N gets a narrow tile and a long other side; about THREADS threads per block."""
    tile_m = min(pow2_ceil(m), 64)
    tile_n = min(pow2_ceil(n), 64 if tile_m == 64 else 128)
    if tile_n < 64:
        tile_m = min(pow2_ceil(m), 128)
    per_thread = max(1, tile_m * tile_n // THREADS)
    thread_n = min(4, tile_n, per_thread)
    thread_m = min(4, tile_m, per_thread // thread_n)
    return tile_m, tile_n, thread_m, thread_n


def choose_tiles(k: TileKernel, m: str | None, n: str, ctx: Context) -> MatmulTile:
    """The tile of axes m x n of k, with the TILE_M/N and THREAD_M/N knobs applied (no M: 1)."""
    tm, tn, pm, pn = default_tiles(k.extent(m), k.extent(n))
    tile_n, thread_n = ctx.knob("TILE_N", tn), ctx.knob("THREAD_N", pn)
    tile_m, thread_m = (ctx.knob("TILE_M", tm), ctx.knob("THREAD_M", pm)) if m else (1, 1)
    for tile, thread, side in ((tile_m, thread_m, "M"), (tile_n, thread_n, "N")):
        if tile % thread:
            raise KnobError(f"TILE_{side}={tile}, THREAD_{side}={thread}: the thread tile must "
                            f"divide the block tile")
    threads = tile_m // thread_m * (tile_n // thread_n)
    if threads > 1024:
        raise KnobError(f"a {tile_m}x{tile_n} tile of {thread_m}x{thread_n} points per thread "
                        f"needs {threads} threads (more than 1024)")
    return MatmulTile(m, n, tile_m, tile_n, thread_m, thread_n)


def edge(var: str | None, extent: int, tile: int):
    """`var < extent` when the last tile along var overhangs the matrix, else None."""
    if var is None or extent % tile == 0:
        return None
    return call("lt", Var(var), Const(extent))


def conjoin(a, b):
    """a && b, where None means true."""
    if a is None or b is None:
        return a if b is None else b
    return call("logical_and", a, b)


def without(pred, cond):
    """pred with the conjunct `cond` removed (None when nothing is left)."""
    if pred == cond:
        return None
    if isinstance(pred, Op) and pred.op == "logical_and":
        return conjoin(without(pred.args[0], cond), without(pred.args[1], cond))
    return pred


def fastest_axis(k: TileKernel, stmts, k_var: str, x_var: str | None) -> str:
    """"x" when one of an operand's loads is contiguous in global memory along its M (N) axis
    and not along K, else "k": a tile fill walks that coordinate fastest."""
    for s in stmts:
        if isinstance(s, Load):
            flat = flat_index(s.index, k.shape_of(s.buf))
            if x_var and coefficient(flat, x_var) == 1 and coefficient(flat, k_var) != 1:
                return "x"
    return "k"


def along(k: TileKernel, load: Load, var: str) -> bool:
    """Whether consecutive `var` read consecutive elements of the load's buffer."""
    return coefficient(flat_index(load.index, k.shape_of(load.buf)), var) == 1


def affine(k: TileKernel, load: Load, var: str) -> bool:
    """Whether the load moves a fixed stride a `var` step (rows of heads x head dim do not)."""
    return coefficient(flat_index(load.index, k.shape_of(load.buf)), var) is not None


def outer_vectors(k_total: int, lanes: int, ctx: Context, chunkable: bool = False) -> int:
    """SIMD vectors across the outer form's register tile row, WIDE_N or CPU_VECTORS_N: a block
    packs a panel of that many vectors of columns (TILE_N's default) for K = `k_total`."""
    half_l2 = dict(ctx.arch.caches).get("L2", 1 << 19) // 2    # the panel's share of L2
    fits = k_total * WIDE_N * lanes * 4 <= half_l2 or chunkable
    return WIDE_N if ctx.arch.vector_registers >= 32 and fits else CPU_VECTORS_N


def one_block_n(k: TileKernel, c: Contraction, lanes: int, ctx: Context) -> int:
    """TILE_N of an outer-form matrix product that fuses its computed M-side operand and takes
    all of N in one block when N is over one panel but at most two (0 otherwise): each operand
    row is then computed once, not once per block. Causal attention's scores of the second 64
    queries of 128 (N = 128 keys, K = 64) ran 1.50x faster so than stored first (PROLOGUE=fuse,
    TILE_N=128, THREAD_M=2 found by `strata tune TinyLlama...`, Zen 5, 2026-11-30)."""
    panel = outer_vectors(sum(l.extent for l in c.loops), lanes, ctx) * lanes
    n = k.extent(c.n)
    if c.m is None or ctx.knob("TILE_N", 0) or ctx.arch.vector_registers < 32 \
            or not panel < n <= 2 * panel:
        return 0                        # (16 registers hold no 2 x 8 tile: AVX2 keeps its rule)
    return -(-n // lanes) * lanes


def cpu_form(k: TileKernel, c: Contraction, ctx: Context) -> str:
    """FORM of a CPU contraction (cpu_prologue and cpu_matmul both follow it): "dot" (vectors
    along K, no packing) when every reduction runs over at least DOT_MIN_K (DOT_FEW_M_MIN_K for
    bf16 of at most DOT_FEW_M rows) and its N-side operand is a load contiguous along K, and either
      - the target has AVX512-BF16 and the reduction is a bf16 contraction (Accum.operands: eager
        holds both multiplicands in bf16, so a computed M-side operand may be stored in bf16)
        of a bf16 N-side operand: vdpbf16ps does two bf16 multiply-adds per lane; or
      - both operands are f32 and M is at most DOT_MAX_M (DOT_MAX_M_16 with 16 vector
        registers): packing the N-side panel costs about what the dot form's whole work does
        (FORM=dot pinned where the N side is strided along K is refused);
    else "pairs" (a packed bf16 panel holding K in pairs, vdpbf16ps with vectors along N) for a
    bf16 contraction of bf16 operands, K even (x @ w of a (K, N) matrix, attention's q @ k^T
    with K = 64 and P @ V: at M = 256 to 1024 it took 0.50x to 0.68x the time of storing the
    (K, N) side transposed for the dot form, Zen 4, 2026-11-28); else "outer" (a packed f32 panel).
    Before all of these, "amx" (the pairs form on AMX tiles) on a target with AMX-BF16 where
    the pairs form's bf16 conditions hold for any M of at least AMX_MIN_M and K of AMX_MIN_K;
    then "pairs" for any M on AVX512-BF16 where every N-side operand is a weight as stored
    (`weight_panel`: packed once at load, so the panel costs no call anything): a bf16 linear
    2048 -> 5632 took 0.70x to 0.79x the dot form's time at M = 4 to 512 (Zen 4, 2026-11-28)."""
    dp = ctx.arch.has("avx512_bf16")

    def along_k(loop) -> bool:          # the N side's loads contiguous along K
        return loop.extent == 1 or all(along(k, s, loop.var) for s in
                                       closure(loop.body, sides(c, loop)[1]) if isinstance(s, Load))

    def fits(loop) -> bool:
        a, b = sides(c, loop)
        side, a_side = closure(loop.body, b), closure(loop.body, a)
        if len(side) != 1 or not isinstance(side[0], Load) or not along_k(loop):
            return False
        if k.dtype_of(side[0].buf) == "bf16":     # each point's lanes are summed after its loop
            few = k.extent(c.m) <= DOT_FEW_M
            return dp and loop.extent >= (DOT_FEW_M_MIN_K if few else DOT_MIN_K) and \
                held(loop) == "bf16" and (len(a_side) > 1 or k.dtype_of(a_side[0].buf) == "bf16")
        rows = DOT_MAX_M if ctx.arch.vector_registers >= 32 else DOT_MAX_M_16
        return k.dtype_of(side[0].buf) == "f32" and loop.extent >= DOT_MIN_K and \
            k.extent(c.m) <= rows and all(k.dtype_of(s.buf) == "f32" for s in a_side if isinstance(s, Load))

    def pairs(loop) -> bool:
        b = closure(loop.body, sides(c, loop)[1])
        return bf16_exact(k, c, loop) and loop.extent % 2 == 0 and len(b) == 1 \
            and isinstance(b[0], Load) and k.dtype_of(b[0].buf) in ("bf16", *dtypes.FLOAT8)
    if c.m is None:
        return "outer"                  # a matrix-vector product: rows of dot products already
    amx = ctx.arch.has("amx_bf16") and k.extent(c.m) >= AMX_MIN_M and \
        all(pairs(l) and l.extent >= AMX_MIN_K for l in c.loops)
    weights = dp and all(pairs(l) and weight_panel(k, c, l, ctx) for l in c.loops)
    form = ctx.knob("FORM", "amx" if amx else "pairs" if weights else
                    "dot" if all(map(fits, c.loops)) else
                    "pairs" if dp and all(map(pairs, c.loops)) else "outer")
    if form == "dot" and not all(map(along_k, c.loops)):     # (gcc took 200 s on its gathers)
        raise KnobError("FORM=dot reads the N-side operand along K, and here it is strided along "
                        "K (x @ w of a (K, N) matrix): use FORM=pairs (bf16) or FORM=outer")
    return form


def weight_panel(k: TileKernel, c: Contraction, loop: Loop, ctx: Context) -> bool:
    """Whether a reduce loop's N-side operand is a weight as stored, read along K and N only:
    cpu_pack_weights then packs its panel once, when the program is loaded (unless PACK=call)."""
    b = closure(loop.body, sides(c, loop)[1])
    if len(b) != 1 or not isinstance(b[0], Load) or b[0].pred is not None \
            or ctx.knob("PACK", "once") == "call":
        return False
    info = next((x for x in k.buffers if x.name == b[0].buf), None)
    return info is not None and info.kind == "weight" \
        and set().union(*map(free_vars, b[0].index)) <= {loop.var, c.n}


def plain_bf16(k: TileKernel, side, var: str) -> bool:
    """Whether an operand is a bf16 load contiguous along K (what vdpbf16ps reads as it is)."""
    return len(side) == 1 and isinstance(side[0], Load) and k.dtype_of(side[0].buf) == "bf16" \
        and along(k, side[0], var)


def dequantized(k: TileKernel, side) -> bool:
    """Whether an operand's statements read an integer buffer (a QuantLinear's blocks)."""
    return any(isinstance(s, Load) and k.dtype_of(s.buf) in dtypes.INTS for s in side)


def value_dtype(s) -> str:
    """The value dtype of a Loop IR Load or Let."""
    return s.dtype if isinstance(s, Load) else s.value.dtype


def split_prologues(k: TileKernel, c: Contraction, computed, dtype: str, axes: set[str],
                    ctx: Context, who: str, tag: str = "") -> tuple[TileKernel, ...]:
    """A contraction whose computed operands are stored once by kernels of their own: the
    prologue kernels `<name>_prologue[i]` (elementwise over the operand's axes and K, one per
    distinct operand: equal operands of several reductions share one) storing `dtype` temps
    `<name>_operand[i]`, then the contraction loading those plainly. computed: (loop, operand
    value, the other operand's value, what to call it in the log[, its own dtype]) per operand
    to store; `who`: the pass, for the log; `tag`: a suffix of the new names (a second split of
    the same kernel)."""
    firsts, made, loops = [], {}, {id(l): l for l in c.loops}
    for loop, value, other, label, *own in computed:
        stmts = closure(loop.body, value)
        deps = depends(loop.body, axes)[value]
        dom = tuple((v, e) for v, e in k.domain if v in deps) + ((loop.var, loop.extent),)
        key = _canonical(stmts, value, dom, loop.var)
        if key not in made:
            i = len(made)
            name = f"{k.name}_prologue{tag}{i or ''}"
            buf = BufferInfo(f"{k.name}_operand{tag}{i or ''}", tuple(e for _, e in dom),
                             own[0] if own else dtype, "temp")
            pre = prelude_for(k.prelude, stmts)
            reads = tuple(r for r in k.reads if _loads(pre + stmts, r))
            var = Var(value, next(s.dtype for s in stmts if s.var == value))
            body = stmts + (Store(buf.name, tuple(Var(v) for v, _ in dom), var),)
            order, body = dom, body
            if len(stmts) == 1 and len(dom) > 1 and not along(k, stmts[0], loop.var):
                order, body = _tiled_transpose(dom, body)
            firsts.append(TileKernel(name, "elementwise", order, pre, body, reads=reads,
                                     writes=(buf.name,), src=k.src,
                                     buffers=tuple(b for b in k.buffers if b.name in reads) + (buf,))
                          .with_knob("PROLOGUE", "materialize"))
            made[key] = buf
            ctx.log(f"{who}: {k.name}: {label} computed once into {buf.name} "
                    f"{list(buf.shape)} {dtype} by {name}")
        buf = made[key]
        cur = loops[id(loop)]
        keep = {id(s) for s in closure(loop.body, other)}
        drop = {id(s) for s in stmts} - keep
        load = Load(value, buf.name, tuple(Var(v) for v, _ in dom), dtypes.compute_dtype(buf.dtype))
        loops[id(loop)] = replace(cur, body=(load,) + tuple(s for s in cur.body if id(s) not in drop))
    body = tuple(loops.get(id(s), s) if isinstance(s, Loop) else s for s in c.body)
    temps = tuple(dict.fromkeys(made.values()))
    keep = {r for r in k.reads if _loads(tuple(k.prelude) + body, r)}
    second = replace(k, body=body, reads=tuple(b.name for b in temps) + tuple(r for r in k.reads if r in keep),
                     buffers=tuple(b for b in k.buffers if b.name in keep or b.name in k.writes) + temps)
    return (*firsts, second.with_knob("PROLOGUE", "materialize"))


def _tiled_transpose(dom, body, tile: int = 32) -> tuple:
    """A transposing copy's domain in tile x tile squares (cpu_prologue's M-side operand read
    across K, stored contiguous): each square's reads stay in L1 and its rows are written whole
    (row by row, the writes or the reads strided by the matrix's width ran at 1 GB/s)."""
    (n, n_ext), (k, k_ext) = dom[-2:]
    if n_ext % tile or k_ext % tile:
        return dom, body
    at = {v: call("add", call("multiply", Var(f"{v}_o"), Const(tile)), Var(f"{v}_i"))
          for v in (n, k)}
    order = dom[:-2] + ((f"{n}_o", n_ext // tile), (f"{k}_o", k_ext // tile), (f"{n}_i", tile),
                        (f"{k}_i", tile))
    return order, subst_body(body, at)


def prelude_for(prelude, stmts) -> tuple:
    """The statements of a prelude (computed once, before the parallel domain: a decode step's
    RMSNorm scale, and the row sum it takes, a reduce loop) that `stmts` read, in order."""
    need, out = set().union(*map(reads, stmts)), []
    for s in reversed(prelude):
        made = {a.acc for a in s.accs} if isinstance(s, Loop) else \
            {s.var} if isinstance(s, (Load, Let)) else set()
        if made & need:
            need |= reads(s)
            out.append(s)
    return tuple(reversed(out))


def _canonical(stmts, value: str, dom, k_var: str) -> tuple:
    """The operand with its names made canonical: equal keys compute equal tensors."""
    names = {s.var: f"t{i}" for i, s in enumerate(stmts)} | {k_var: "K"}
    return tuple(rename_stmt(s, names) for s in stmts), names[value], \
        tuple((names.get(v, v), e) for v, e in dom)


def _loads(body, buf: str) -> bool:
    return any(isinstance(s, Load) and s.buf == buf for s in walk(body))
