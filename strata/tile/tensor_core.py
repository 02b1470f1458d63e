"""What the tensor-core schedules (mma_tile, mma_swizzle, mma_pipeline, wgmma_tile,
materialize_prologue) share: which reduce loops can run on tensor cores and with which 16-bit
(or, for wgmma, FP8) operands, and the shapes of the operand tiles in shared memory and in TMA
boxes. A module of its own so that passes never import each other."""
from __future__ import annotations

from ..core import dtypes
from ..core.expr import Var, affine_terms, coefficient
from ..loop.ir import Accum, Let, Load, Loop
from .contraction import closure, conjoin, depends, edge, fp8_rounded, product
from .ir import Guard, MmaLoop, MmaOperand, MmaTile, TileKernel, flat_index


HALF = ("f16", "bf16")


def tile_rows_cols(op: MmaOperand, mt: MmaTile) -> tuple[int, int]:
    """(rows, cols) of the operand's shared tile for one stage, before padding."""
    x = mt.tile_m if op.side == "A" else mt.tile_n
    return (x, mt.tile_k) if op.kmajor else (mt.tile_k, x)


def half_dtype(k: TileKernel, stmts, out_half: bool, fp8: bool = False) -> str:
    """The 16-bit dtype the operand computed by stmts has (or an FP8 one it loads as it is,
    where `fp8`: wgmma's e4m3/e5m2 forms), or why it has none."""
    loads = [s for s in stmts if isinstance(s, Load)]
    kinds = {k.dtype_of(s.buf) for s in loads}
    if fp8:
        rounded = kinds.pop() if len(stmts) == 1 and kinds and kinds <= set(dtypes.FLOAT8) \
            else fp8_rounded(stmts)
        if rounded:
            return rounded
    if len(kinds) != 1 or not kinds <= set(HALF):
        return f"it reads {', '.join(sorted(kinds)) or 'no buffer'}, not f16 or bf16 alone"
    if any(isinstance(s, Let) for s in stmts) and not out_half:
        return "its prologue computes in f32 for an f32 result (rounding it to 16 bits would " \
               "lose what eager keeps)"
    return kinds.pop()


def kmajor(k: TileKernel, stmts, k_var: str, x_var: str | None) -> bool:
    """K contiguous in shared memory unless a load is contiguous along X instead."""
    for s in stmts:
        if isinstance(s, Load):
            flat = flat_index(s.index, k.shape_of(s.buf))
            if x_var and coefficient(flat, x_var) == 1 and coefficient(flat, k_var) != 1:
                return False
    return True


def operands(k: TileKernel, loop: Loop, m, n, out_half: bool, fp8: bool = False):
    """(acc, A, B, dtype) of one reduce loop, or why it cannot run on tensor cores (FP8 operands
    only where `fp8`)."""
    found = product(loop.body)
    if isinstance(found, str):
        return found
    a, b, p = found
    axes = {v for v, _ in k.domain}
    if n in depends(loop.body, axes)[a]:
        a, b = b, a
    acc = loop.accs[0]
    if acc.dtype != "f32":
        return f"{loop.var} accumulates in {acc.dtype}, not f32"
    ca, cb = closure(loop.body, a), closure(loop.body, b)
    rest = [s for s in loop.body if not any(s is x for x in ca + cb)
            and not isinstance(s, Accum) and getattr(s, "var", None) != p]
    if rest:
        return f"{loop.var} computes more than its two operands"
    held = next(s.operands for s in loop.body if isinstance(s, Accum))
    dts = []
    for side, stmts in (("A", ca), ("B", cb)):
        # a 16-bit contraction in eager: each operand is a 16-bit tensor there, so rounding a
        # computed prologue (RMSNorm's normed x, SiLU(gate) * up) to it is what eager does
        dt = held if held in HALF else half_dtype(k, stmts, out_half, fp8)
        if dt not in HALF + dtypes.FLOAT8:
            return f"operand {side} of {loop.var}: {dt}"
        dts.append(dt)
    if dts[0] != dts[1]:
        return f"{loop.var} multiplies {dts[0]} by {dts[1]}"
    ops = []
    for side, value, stmts, x in (("A", a, ca, m), ("B", b, cb, n)):
        ops.append(MmaOperand(side, value, x, k.extent(x), stmts, kmajor(k, stmts, loop.var, x)))
    return acc, ops[0], ops[1], dts[0]


def mma_loops(k: TileKernel, c, fp8: bool = False) -> tuple[list[MmaLoop], str] | str:
    """The contraction `c`'s reduce loops as MmaLoops and their one 16-bit (or, where `fp8`,
    FP8) dtype, or why not."""
    out_half = all(k.dtype_of(w) in HALF for w in k.writes)
    loops, dtype = [], None
    for loop in c.loops:
        got = operands(k, loop, c.m, c.n, out_half, fp8)
        if isinstance(got, str):
            return got
        acc, a, b, dt = got
        if dtype not in (None, dt):
            return f"its reductions mix {dtype} and {dt}"
        dtype = dt
        loops.append(MmaLoop(acc, loop.var, loop.extent, a, b))
    return loops, dtype


def edge_guarded(k: TileKernel, c, tile_m: int, tile_n: int) -> tuple:
    """The row statements after the K loops, guarded at the M and N edges of the tiles."""
    guard = conjoin(edge(c.m, k.extent(c.m), tile_m), edge(c.n, k.extent(c.n), tile_n))
    rest = tuple(s for s in c.body if not isinstance(s, Loop))
    return (Guard(guard, rest),) if guard is not None and rest else rest


def row_stride(cols: int, swizzle: str) -> int:
    """Elements between rows of a shared tile: padded by 16 bytes with SWIZZLE=pad."""
    return cols + 8 if swizzle == "pad" else cols


def stage_elems(op: MmaOperand, mt: MmaTile) -> int:
    """Elements of one stage of the operand's shared tile."""
    rows, cols = tile_rows_cols(op, mt)
    return rows * row_stride(cols, mt.swizzle)


SWIZZLE_OF_ROW = {32: "32B", 64: "64B", 128: "128B"}     # by the bytes of a shared row (of TILE_K)


def tma_dims(k: TileKernel, op: MmaOperand, k_var: str, k_extent: int):
    """((var, extent, stride in elements), ...) of the operand's TMA map, innermost first: K
    then X for a K-major operand, X then K for an MN-major one (contiguous along its M or N
    axis: wgmma reads it with the transpose bit), then the batch axes its load uses; or why TMA
    cannot fetch it ("" never)."""
    if len(op.body) != 1 or not isinstance(op.body[0], Load):
        return "it computes a prologue"
    load = op.body[0]
    if load.pred is not None:
        return "its load is predicated"
    terms = affine_terms(flat_index(load.index, k.shape_of(load.buf)))
    if terms is None or not all(isinstance(a, Var) for a in terms[0]):
        return "its index is not affine in the loop axes"
    coeffs, const = terms
    coeffs = {a.name: c for a, c in coeffs.items() if c}
    if const:
        return "its index has a constant offset"
    if not coeffs.get(op.x_var):
        return f"it does not depend on {op.x_var}"
    if not coeffs.get(k_var):
        return f"it does not depend on {k_var}"
    batch = {v: e for v, e in k.domain if v != op.x_var}     # (the other of M, N never occurs)
    if coeffs[k_var] == 1:              # K-major
        dims = [(k_var, k_extent, 1), (op.x_var, op.x_extent, coeffs[op.x_var])]
    elif coeffs[op.x_var] == 1:         # MN-major: wgmma reads it transposed
        dims = [(op.x_var, op.x_extent, 1), (k_var, k_extent, coeffs[k_var])]
    else:
        return f"it is contiguous along neither {k_var} nor {op.x_var}"
    rest = sorted((c, v) for v, c in coeffs.items() if v not in (k_var, op.x_var))
    for c, v in rest:
        if v not in batch:
            return f"its index uses {v}, not a batch axis"
        dims.append((v, batch[v], c))
    if len(dims) > 5:
        return "it has more than 5 dimensions"
    bad = [v for v, _, c in dims[1:] if c * dtypes.ITEMSIZE[k.dtype_of(load.buf)] % 16]
    if bad:
        return f"its stride along {bad[0]} is not a multiple of 16 bytes"
    return tuple(dims)


def mn_major(k: TileKernel, lp: MmaLoop, op: MmaOperand) -> bool:
    """Whether TMA fetches the operand MN-major (contiguous along its M or N axis)."""
    dims = tma_dims(k, op, lp.k_var, lp.extent)
    return not isinstance(dims, str) and dims[0][0] != lp.k_var
