"""Rules for layout ops: views, permutes, slices, concatenation, gathers.

Every view-like op is one IndexMap (composed with the IndexMap it reads, so chains of views stay
one node). cat selects its pieces with Iota comparisons and `where`, each piece read through an
IndexMap that is only valid inside its own range; triu/tril compare two Iotas; roll keeps its
index non-negative with (i + n - shift) % n; embedding/index_select/gather are Gather nodes.
"""
from __future__ import annotations

from ..core.errors import UnsupportedOp
from ..core.expr import Const, Var, call
from .builder import T, broadcast_shapes, norm_axis, rule
from .ir import IDX


def ivars(rank: int) -> list:
    return [Var(f"i{d}") for d in range(rank)]


@rule("aten.view", "aten._unsafe_view", "aten.reshape", "aten.view_copy", "aten._reshape_alias",
      "aten.squeeze", "aten.unsqueeze", "aten.flatten", "aten.unflatten")
def view(b, a):
    return b.reshape(a.self, b.out.shape)


@rule("aten.expand", "aten.expand_as", "aten.broadcast_to", "aten.expand_copy")
def expand(b, a):
    return b.bcast(a.self, b.out.shape)


@rule("aten.permute")
def permute(b, a):
    x = a.self
    index = [None] * x.rank
    for k, d in enumerate(a.dims):
        index[norm_axis(d, x.rank)] = Var(f"i{k}")
    return b.index_map(x, b.out.shape, tuple(index), hint="permute")


@rule("aten.transpose", "aten.t", "aten.swapaxes", "aten.numpy_T")
def transpose(b, a):
    x = a.self
    if x.rank < 2:
        return x
    d0 = norm_axis(a.get("dim0", 0), x.rank)
    d1 = norm_axis(a.get("dim1", 1), x.rank)
    index = ivars(x.rank)
    index[d0], index[d1] = index[d1], index[d0]
    return b.index_map(x, b.out.shape, tuple(index), hint="transpose")


def _clip(v, n, default):
    if v is None:
        return default
    v = v + n if v < 0 else v
    return min(max(v, 0), n)


@rule("aten.slice", "aten.slice_copy")
def slice_(b, a):
    x = a.self
    d = norm_axis(a.get("dim", 0), x.rank)
    n = x.shape[d]
    start = _clip(a.get("start"), n, 0)
    step = a.get("step") or 1
    index = ivars(x.rank)
    index[d] = call("add", call("multiply", index[d], step), start)
    return b.index_map(x, b.out.shape, tuple(index), hint="slice")


@rule("aten.slice_scatter")
def slice_scatter(b, a):
    """self with self[..., start:end:step, ...] replaced by src (slicing's backward): src mapped
    onto the positions the slice takes, where a position is one of them."""
    x, src = a.self, b.cast(a.src, a.self.dtype)
    d = norm_axis(a.get("dim", 0), x.rank)
    n = x.shape[d]
    start, end, step = _clip(a.get("start"), n, 0), _clip(a.get("end"), n, n), a.get("step") or 1
    if src.numel == 0:
        return x
    i, index = Var(f"i{d}"), ivars(x.rank)
    index[d] = call("floordiv", call("subtract", i, start), step) if step > 1 else \
        call("subtract", i, start)
    taken = call("logical_and", call("ge", i, start), call("lt", i, end))
    if step > 1:
        taken = call("logical_and", taken, call("eq", call("mod", call("subtract", i, start), step), 0))
    placed = b.index_map(src, x.shape, tuple(index), valid=taken, fill=0, hint="placed")
    pos = b.iota(x.shape, d, hint="pos")
    mask = b.ew("logical_and", b.ew("ge", pos, start), b.ew("lt", pos, end), hint="taken")
    if step > 1:
        on_step = b.ew("eq", b.ew("mod", b.ew("subtract", pos, start), step), 0, hint="on_step")
        mask = b.ew("logical_and", mask, on_step, hint="taken")
    return b.ew("where", mask, placed, x, dtype=x.dtype, hint="slice_scatter")


@rule("aten.narrow")
def narrow(b, a):
    x = a.self
    d = norm_axis(a.dim, x.rank)
    start = a.start + x.shape[d] if a.start < 0 else a.start
    index = ivars(x.rank)
    index[d] = call("add", index[d], start)
    return b.index_map(x, b.out.shape, tuple(index), hint="narrow")


@rule("aten.select", "aten.select_copy")
def select(b, a):
    x = a.self
    d = norm_axis(a.dim, x.rank)
    i = a.index + x.shape[d] if a.index < 0 else a.index
    outv = ivars(x.rank - 1)
    index = outv[:d] + [Const(i)] + outv[d:]
    return b.index_map(x, b.out.shape, tuple(index), hint="select")


@rule("aten.diagonal", "aten.diagonal_copy")
def diagonal(b, a):
    """x.diagonal(offset, dim1, dim2): dim1 and dim2 dropped, the diagonal appended last
    (einsum("ii->i") becomes one)."""
    x = a.self
    off = a.get("offset", 0) or 0
    d1, d2 = norm_axis(a.get("dim1", 0), x.rank), norm_axis(a.get("dim2", 1), x.rank)
    shape = b.out.shape
    if 0 in shape:
        return b.full(shape, 0, x.dtype)
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    k = Var(f"i{len(rest)}")
    index: list = [None] * x.rank
    for j, d in enumerate(rest):
        index[d] = Var(f"i{j}")
    index[d1] = call("add", k, max(-off, 0))
    index[d2] = call("add", k, max(off, 0))
    return b.index_map(x, shape, tuple(index), hint="diagonal")


@rule("aten.diagonal_scatter")
def diagonal_scatter(b, a):
    """x with its diagonal (offset, dim1, dim2, as aten.diagonal reads it) replaced by src
    (diagonal's backward): where the position is on the diagonal, src at (the other dims, the
    position along the diagonal), else x."""
    x, src = a.self, a.src
    off = a.get("offset", 0) or 0
    d1, d2 = norm_axis(a.get("dim1", 0), x.rank), norm_axis(a.get("dim2", 1), x.rank)
    if 0 in x.shape or 0 in src.shape:
        return x
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    i1, i2 = Var(f"i{d1}"), Var(f"i{d2}")
    along = call("subtract", i1, max(-off, 0))          # k: d1 = k + max(-off, 0)
    index = tuple(Var(f"i{d}") for d in rest) + (along,)
    on = call("logical_and", call("eq", call("subtract", i2, i1), off),
              call("logical_and", call("ge", along, 0), call("lt", along, src.shape[-1])))
    put = b.index_map(b.cast(src, x.dtype), x.shape, index, valid=on, fill=0, hint="diag_src")
    mask = b.index_map(b.full((), True, "bool"), x.shape, (), valid=on, fill=False, hint="on_diag")
    return b.ew("where", mask, put, x, dtype=x.dtype, hint="diagonal_scatter")


@rule("aten.flip")
def flip(b, a):
    x = a.self
    index = ivars(x.rank)
    for d in {norm_axis(d, x.rank) for d in a.dims}:
        index[d] = call("subtract", x.shape[d] - 1, index[d])
    return b.index_map(x, x.shape, tuple(index), hint="flip")


@rule("aten.roll")
def roll(b, a):
    x = a.self
    shifts, dims = list(a.shifts), list(a.get("dims") or [])
    if not dims:                                   # roll the flattened tensor
        flat = b.reshape(x, (x.numel,), hint="flat")
        rolled = _roll(b, flat, shifts[0], 0)
        return b.reshape(rolled, x.shape)
    for s, d in zip(shifts, dims):
        x = _roll(b, x, s, norm_axis(d, x.rank))
    return x


def _roll(b, x: T, shift: int, d: int) -> T:
    n = x.shape[d]
    s = shift % n if n else 0
    if s == 0:
        return x
    index = ivars(x.rank)
    index[d] = call("mod", call("add", index[d], n - s), n)
    return b.index_map(x, x.shape, tuple(index), hint="roll")


@rule("aten.repeat")
def repeat(b, a):
    x = a.self
    shape = b.out.shape
    lead = len(shape) - x.rank
    index = tuple(call("mod", Var(f"i{d + lead}"), n) if n != shape[d + lead] else Var(f"i{d + lead}")
                  for d, n in enumerate(x.shape))
    return b.index_map(x, shape, index, hint="repeat")


@rule("aten.triu", "aten.tril")
def triu(b, a):
    x = a.self
    k = a.get("diagonal", 0) or 0
    rows = b.iota(x.shape, x.rank - 2, hint="row")
    cols = b.iota(x.shape, x.rank - 1, hint="col")
    diff = b.ew("subtract", cols, rows, hint="diag")
    keep = b.ew("ge" if b.op == "aten.triu" else "le", diff, k, hint="mask")
    return b.ew("where", keep, x, 0, dtype=x.dtype)


def cat_along(b, xs: list, d: int, shape) -> T:
    """Concatenate along d: a where-chain on iota(d) over pieces valid in their own range."""
    xs = [x for x in xs if x.numel > 0]       # torch skips empty pieces, (0,) ones included
    if not xs:
        return b.full(shape, 0, b.out.dtype)
    if len(xs) == 1:
        return xs[0]
    pieces, offsets, off = [], [], 0
    for x in xs:
        i = Var(f"i{d}")
        index = ivars(len(shape))
        index[d] = call("subtract", i, off)
        lo, hi = call("ge", i, off), call("lt", i, off + x.shape[d])
        valid = hi if off == 0 else (lo if off + x.shape[d] == shape[d] else call("logical_and", lo, hi))
        pieces.append(b.index_map(x, shape, tuple(index), valid=valid, fill=0, hint=f"part{len(pieces)}"))
        offsets.append(off)
        off += x.shape[d]
    pos = b.iota(shape, d, hint="pos")
    out = pieces[-1]
    for piece, end in reversed(list(zip(pieces[:-1], offsets[1:]))):
        take = b.ew("lt", pos, end, hint=f"lt{end}")
        out = b.ew("where", take, piece, out, dtype=out.dtype, hint="select")
    return out


@rule("aten.cat", "aten.concat", "aten.concatenate")
def cat(b, a):
    shape = b.out.shape
    d = norm_axis(a.get("dim", 0), len(shape))
    return cat_along(b, [b.cast(x, b.out.dtype) for x in a.tensors], d, shape)


@rule("aten.stack")
def stack(b, a):
    shape = b.out.shape
    d = norm_axis(a.get("dim", 0), len(shape))
    parts = []
    for x in a.tensors:
        one = shape[:d] + (1,) + shape[d + 1:]
        parts.append(b.reshape(b.cast(x, b.out.dtype), one, hint="unsqueeze"))
    return cat_along(b, parts, d, shape)


@rule("aten.atleast_1d", "aten.atleast_2d", "aten.atleast_3d")
def atleast(b, a):
    """The list form (`torch.atleast_2d(x, y)`; export keeps it whole): each tensor reshaped to
    the shape export recorded."""
    if "tensors" not in a:
        return b.reshape(a.self, b.out.shape)
    return tuple(b.reshape(x, t.shape, hint=f"atleast{k}")
                 for k, (x, t) in enumerate(zip(a.tensors, b.out)))


@rule("aten.meshgrid")
def meshgrid(b, a):
    """Each 0-d or 1-d input broadcast along its own output dimension (with indexing="xy" the
    first two inputs take dimensions 1 and 0)."""
    xs = list(a.tensors)
    dims = list(range(len(xs)))
    if a.get("indexing") == "xy" and len(xs) >= 2:
        dims[0], dims[1] = 1, 0
    outs = []
    for k, (x, t) in enumerate(zip(xs, b.out)):
        if 0 in t.shape:
            outs.append(b.full(t.shape, 0, x.dtype, hint=f"grid{k}"))
            continue
        index = (Var(f"i{dims[k]}"),) if x.rank else ()
        outs.append(b.index_map(x, t.shape, index, hint=f"grid{k}"))
    return tuple(outs)


@rule("aten.split_with_sizes", "aten.split")
def split(b, a):
    x = a.self
    d = norm_axis(a.get("dim", 0), x.rank)
    sizes = a.get("split_sizes") or a.get("split_size")
    if isinstance(sizes, int):
        sizes = [min(sizes, x.shape[d] - s) for s in range(0, x.shape[d], sizes)]
    outs, off = [], 0
    for n in sizes:
        index = ivars(x.rank)
        index[d] = call("add", index[d], off)
        shape = x.shape[:d] + (n,) + x.shape[d + 1:]
        outs.append(b.index_map(x, shape, tuple(index), hint=f"split{len(outs)}"))
        off += n
    return tuple(outs)


@rule("aten.unbind")
def unbind(b, a):
    x = a.self
    d = norm_axis(a.get("dim", 0), x.rank)
    outs = []
    for i in range(x.shape[d]):
        outv = ivars(x.rank - 1)
        index = outv[:d] + [Const(i)] + outv[d:]
        outs.append(b.index_map(x, x.shape[:d] + x.shape[d + 1:], tuple(index), hint=f"unbind{i}"))
    return tuple(outs)


@rule("getitem")
def getitem(b, a):
    return a.self[a.index]


def gather_along(b, src: T, idx: T, d: int, shape) -> T:
    """out[o] = src[o with dim d replaced by idx[o]]; idx broadcast to `shape` first."""
    if src.rank == 0:
        return b.gather(src, idx, ())
    index = ivars(len(shape))
    index[d] = IDX
    return b.gather(src, idx, tuple(index))


@rule("aten.embedding")
def embedding(b, a):
    w, ids = a.weight, a.indices
    shape = b.out.shape
    idx = b.index_map(ids, shape, tuple(ivars(ids.rank)), hint="ids")
    return b.gather(w, idx, (IDX, Var(f"i{len(shape) - 1}")))


@rule("aten.index_select")
def index_select(b, a):
    x, ids = a.self, a.index
    shape = b.out.shape
    d = norm_axis(a.dim, x.rank) if x.rank else 0
    idx = b.index_map(ids, shape, (Var(f"i{d}"),) if ids.rank and shape else (Const(0),) * ids.rank,
                      hint="ids")
    return gather_along(b, x, idx, d, shape)


@rule("aten.gather")
def gather(b, a):
    x, ids = a.self, a.index
    d = norm_axis(a.dim, x.rank) if x.rank else 0
    return gather_along(b, x, ids, d, ids.shape)


@rule("aten.index")
def index(b, a):
    """x[..., i, j, ...] with integer index tensors (advanced indexing).

    One index tensor reads x through its value directly. Several are broadcast together and
    combined into one flat position over the indexed dims (each made non-negative first), which a
    single Gather unpacks with // and %: the causal and packed-sequence masks Hugging Face models
    build are such reads (`seq_ids[batch, q]`)."""
    x = a.self
    pos = [k for k, t in enumerate(a.indices) if t is not None]
    if not pos or any(a.indices[k].dtype not in ("i64", "i32") for k in pos):
        raise UnsupportedOp("aten.index (only integer index tensors are supported)")
    if len(pos) == 1:
        return _index_one(b, x, pos[0], a.indices[pos[0]])
    ids = [a.indices[k] for k in pos]
    bshape = broadcast_shapes(*[t.shape for t in ids])
    shape = b.out.shape
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    first = pos[0] if adjacent else 0           # where the broadcast index dims sit in the output
    rest = [d for d in range(x.rank) if d not in pos]
    bvars = [Var(f"i{first + k}") for k in range(len(bshape))]
    flat, stride = None, 1
    for k, t in reversed(list(zip(pos, ids))):
        lead = len(bshape) - t.rank
        view = b.index_map(t, shape, tuple(Const(0) if n == 1 and bshape[lead + d] != 1
                                           else bvars[lead + d] for d, n in enumerate(t.shape)),
                           hint=f"ids{k}")
        n = x.shape[k]
        view = b.cast(view, "i64")
        wrapped = b.ew("where", b.ew("lt", view, 0, hint=f"neg{k}"),
                       b.ew("add", view, n, hint=f"wrap{k}"), view, hint=f"pos{k}")
        term = b.ew("multiply", wrapped, stride, hint=f"term{k}") if stride != 1 else wrapped
        flat = term if flat is None else b.ew("add", flat, term, hint="flat")
        stride *= n
    index: list = [None] * x.rank
    stride = 1
    for k in reversed(pos):
        index[k] = call("mod", call("floordiv", IDX, stride), x.shape[k]) if stride != 1 \
            else call("mod", IDX, x.shape[k])
        stride *= x.shape[k]
    out_d = [d for d in range(len(shape)) if not first <= d < first + len(bshape)]
    for d, od in zip(rest, out_d):
        index[d] = Var(f"i{od}")
    return b.gather(x, flat, tuple(index))


def _index_one(b, x: T, d: int, ids: T) -> T:
    shape = b.out.shape
    idx = b.index_map(ids, shape, tuple(Var(f"i{d + k}") for k in range(ids.rank)), hint="ids")
    n = x.shape[d]
    wrapped = call("where", call("lt", IDX, 0), call("add", IDX, n), IDX)   # x[-1] is x[n-1]
    index = ivars(len(shape))
    index = index[:d] + [wrapped] + index[d + ids.rank:]
    return b.gather(x, idx, tuple(index))
