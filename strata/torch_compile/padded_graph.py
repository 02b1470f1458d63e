"""A shape-dynamic dynamo graph rewritten to compute exactly at a bucket's sizes (buckets.py).

Each size symbol takes its bucket's capacity; the rewrite keeps what lies past the call's sizes
(the padding) from ever being read:
- a symbol used as a size (`arange(s40 + 1)`) becomes its value at the capacity; used as a value
  (`arange(1) + s40`, the query's position) it becomes a 0-d tensor input holding the call's;
- an op that mixes positions along a padded axis is made blind to the padding: a reduction or a
  contraction over the axis reads 0 there (-inf for max and softmax) through `where`, attention
  gets a key mask (and its padded keys and values read 0: a NaN key makes a NaN score even under
  a -inf mask), a mean divides by the call's count, a `cat` whose padded piece is followed by
  others writes those at the call's offset (index_copy), `x[-k:]` along a padded axis reads the
  call's last k, and an embedding's padded indices read 0.
Elementwise ops, views that keep each padded axis whole, and ops on tensors without one are left
as they are; anything else (a flip, a reshape across a padded axis, an op not in the tables
below) raises `Refused` with its reason.
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import fx

ELEMENTWISE = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.neg, operator.pos, operator.lt, operator.le, operator.gt, operator.ge,
    operator.eq, operator.ne, operator.and_, operator.or_, operator.xor, operator.invert,
    torch.add, torch.sub, torch.mul, torch.div, torch.where, torch.exp, torch.log, torch.sin,
    torch.cos, torch.tanh, torch.sigmoid, torch.rsqrt, torch.sqrt, torch.abs, torch.neg,
    torch.pow, torch.clamp, torch.maximum, torch.minimum, torch.erf, torch.relu,
    torch.masked_fill, F.silu, F.gelu, F.relu, F.dropout,
    "to", "float", "half", "bfloat16", "double", "int", "long", "bool", "type", "type_as",
    "contiguous", "clone", "detach", "pow", "exp", "log", "sin", "cos", "tanh", "sigmoid",
    "rsqrt", "sqrt", "neg", "abs", "add", "sub", "mul", "div", "masked_fill", "clamp", "relu",
    "__and__", "__or__", "__invert__"}
AXIS_MOVES = {torch.transpose, torch.permute, torch.unsqueeze, torch.squeeze, torch.t, "transpose",
              "permute", "unsqueeze", "squeeze", "t", "expand", "expand_as"}
RESHAPES = {torch.reshape, torch.flatten, "view", "reshape", "flatten"}
CREATES = {torch.arange, torch.zeros, torch.ones, torch.empty, torch.full}
# reductions: the value the padding reads as
REDUCTIONS = {torch.sum: 0, "sum": 0, torch.mean: 0, "mean": 0, torch.amax: "-inf",
              "amax": "-inf", torch.amin: "inf", "amin": "inf", F.softmax: "-inf",
              torch.softmax: "-inf", "softmax": "-inf", F.log_softmax: "-inf",
              torch.log_softmax: "-inf", "log_softmax": "-inf", torch.logsumexp: "-inf",
              "logsumexp": "-inf"}
MATMULS = {torch.matmul, operator.matmul, torch.bmm, torch.mm, "matmul", "bmm", "mm"}
LINEARS = {F.linear, torch._C._nn.linear}
CATS = {torch.cat, torch.concat, torch.concatenate}
# in place on a tensor no padded axis reaches (a cache's length counter: `n.add_(s)`): exact
IN_PLACE = {"add_", "sub_", "mul_", "fill_", "copy_", "zero_"}
INDEX_COPIES = {"index_copy_", torch.Tensor.index_copy_}


class Refused(Exception):
    """The graph cannot run padded exactly; the message says where."""


def example(n):
    return n.meta.get("example_value") if isinstance(n, fx.Node) else None


def padded_axes(n) -> dict[int, sympy.Expr]:
    """The axes of a tensor node whose size holds a symbol, with that size."""
    v = example(n)
    if not isinstance(v, torch.Tensor):
        return {}
    return {d: s.node.expr for d, s in enumerate(v.shape)
            if isinstance(s, torch.SymInt) and s.node.expr.free_symbols}


SYMBOLIC = (torch.SymInt, torch.SymBool, torch.SymFloat)


def fixed(x):
    """x's number where x is a node of a symbolic int whose value is fixed, else x."""
    v = example(x)
    if isinstance(v, torch.SymInt) and not v.node.expr.free_symbols:
        return int(v.node.expr)
    return x


def is_symbolic(v) -> bool:
    return isinstance(v, SYMBOLIC) or isinstance(v, (tuple, list, torch.Size)) and any(
        isinstance(x, SYMBOLIC) for x in v)


def what(n) -> str:
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
    return f"{name} ({n.name})"


class PaddedGraph:
    """`gm` rewritten for capacities `caps` {symbol: size}, node by node: `.module`; one 0-d int64
    input per symbol of `symbols` (in order) replaces its SymInt inputs."""

    def __init__(self, gm: fx.GraphModule, symbols, caps: dict):
        self.caps = caps
        self.g = fx.Graph()
        self.env: dict = {}
        holders = []
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                if not isinstance(example(n), torch.SymInt):
                    self.env[n] = self._copy(n)
                holders.append(n)
        self.sym_nodes = {s: self.g.placeholder(f"sym_{s}") for s in symbols}
        for n in gm.graph.nodes:
            if n.op == "placeholder" or is_symbolic(example(n)):
                continue                     # sizes: taken from their expressions where used
            if n.op == "output":
                self.g.output(self._args(n.args[0], value=False))
            else:
                self.env[n] = self._node(n)
        self.module = fx.GraphModule(gm, self.g)

    def _copy(self, n, args=None, kwargs=None):
        new = self.g.node_copy(n, self._mapped) if args is None else self.g.create_node(
            n.op, n.target, args, kwargs, n.name)
        new.meta = dict(n.meta)
        return new

    def _mapped(self, a):
        """A node's copy; a size dynamo left symbolic but fixed (dynamo specialises 0 and 1) is
        its number, any other size refused (a slice of an unpadded tensor bounded by one)."""
        if a in self.env:
            return self.env[a]
        if (k := fixed(a)) is not a:
            return k
        raise Refused(f"{what(a)}, a size, bounds an op")

    # -- sizes
    def static(self, e) -> int:
        v = sympy.sympify(e).subs(self.caps)
        if not v.is_Integer:
            raise Refused(f"size {e} is not an integer at the bucket")
        return int(v)

    def runtime(self, e):
        """A node (or int) computing the size `e` from the call's symbols."""
        e = sympy.expand(sympy.sympify(e))
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            if e not in self.sym_nodes:
                raise Refused(f"size {e} is not read from any input")
            return self.sym_nodes[e]
        if e.is_Add or e.is_Mul:
            parts = [self.runtime(a) for a in e.args]
            out = parts[0]
            for p in parts[1:]:
                out = self.g.call_function(operator.add if e.is_Add else operator.mul, (out, p))
            return out
        raise Refused(f"size {e} is not affine in the symbols")

    def _args(self, a, value: bool):
        """`a` with nodes mapped; a size is its runtime value where `value`, else its capacity."""
        def one(x):
            if isinstance(x, fx.Node):
                v = example(x)
                if is_symbolic(v):
                    if isinstance(v, (torch.SymBool, torch.SymFloat)):
                        raise Refused(f"a symbolic {type(v).__name__} ({x.name}) used by an op")
                    if isinstance(v, torch.SymInt):
                        return self.runtime(v.node.expr) if value else self.static(v.node.expr)
                    return type(v)(self.static(d.node.expr) if isinstance(d, torch.SymInt) else d
                                   for d in v)
                return self.env[x]
            if isinstance(x, slice):
                if any(isinstance(b, fx.Node) for b in (x.start, x.stop, x.step)):
                    raise Refused("a slice bounded by a size")
            return x
        return fx.node.map_aggregate(a, one)

    # -- ops
    def _node(self, n):
        if type(example(n)) in (bool, int, float) and n.op in ("call_function", "call_method"):
            return example(n)        # a number dynamo fixed (and guards), `not s` among them
        key = n.target if n.op == "call_function" else n.target if n.op == "call_method" else None
        tensors = [x for x in pytree.tree_flatten((n.args, n.kwargs))[0]
                   if isinstance(x, fx.Node) and isinstance(example(x), torch.Tensor)]
        sized = [x for x in pytree.tree_flatten((n.args, n.kwargs))[0]
                 if isinstance(x, fx.Node) and is_symbolic(example(x))]
        if not padded_axes(n) and not any(padded_axes(x) for x in tensors) and not sized:
            return self._copy(n)
        if n.op == "get_attr" or key is None:
            raise Refused(f"{what(n)} on a padded tensor")
        exact_in_place = key in IN_PLACE and not any(padded_axes(x) for x in tensors)
        if sized and not (key in ELEMENTWISE or key in RESHAPES or key in AXIS_MOVES
                          or key in CREATES and _sizes_only(n) or exact_in_place):
            raise Refused(f"{what(n)} takes a size")
        value = key in ELEMENTWISE or exact_in_place
        if exact_in_place:
            return self._copy(n, self._args(n.args, True), self._args(n.kwargs, True))
        args, kwargs = self._args(n.args, value), self._args(n.kwargs, value)
        if key in CREATES or key in ELEMENTWISE or key in AXIS_MOVES:
            if key in ELEMENTWISE:
                self._check_aligned(n, tensors)
            return self._copy(n, args, kwargs)
        if key in RESHAPES:
            self._check_whole(n, tensors[0])
            return self._copy(n, args, kwargs)
        if key is operator.getitem:
            return self._index(n, args, kwargs)
        if key is F.embedding:          # the padding's indices read as 0: within the table
            if padded_axes(n.args[1]):
                raise Refused(f"{what(n)}: a padded table")
            ids = self._masked(n, args[0], n.args[0], padded_axes(n.args[0]), 0)
            return self._copy(n, (ids, *args[1:]), kwargs)
        if key in REDUCTIONS:
            return self._reduce(n, key, args, kwargs)
        if key in MATMULS or key in LINEARS:
            return self._contract(n, key, args, kwargs)
        if key is F.scaled_dot_product_attention:
            return self._attention(n, args, kwargs)
        if key in CATS:
            return self._cat(n, args, kwargs)
        if key in INDEX_COPIES:
            return self._index_copy(n, args, kwargs)
        raise Refused(f"{what(n)} on a padded tensor")

    def _check_aligned(self, n, tensors, along=None):
        """Each padded axis of each operand (broadcast from the right) is the same padded axis of
        the result; `along`: an axis a cat joins its pieces on, where they differ."""
        out = padded_axes(n)
        rank = example(n).dim()
        for x in tensors:
            v = example(x)
            for d, e in padded_axes(x).items():
                if d != along and out.get(d + rank - v.dim()) != e:
                    raise Refused(f"{what(n)}: padded axes that do not line up")

    def _check_whole(self, n, x):
        """A reshape keeps each padded axis whole: as many elements before and after it."""
        a, b = example(x).shape, example(n).shape
        pa, pb = padded_axes(x), padded_axes(n)
        if sorted(map(str, pa.values())) != sorted(map(str, pb.values())):
            raise Refused(f"{what(n)} reshapes across a padded axis")
        for d, e in pa.items():
            k = next(k for k, f in pb.items() if f == e)
            before = sympy.simplify(sympy.Mul(*[_expr(s) for s in a[:d]]) - sympy.Mul(*[_expr(s) for s in b[:k]]))
            after = sympy.simplify(sympy.Mul(*[_expr(s) for s in a[d + 1:]]) - sympy.Mul(*[_expr(s) for s in b[k + 1:]]))
            if before != 0 or after != 0:
                raise Refused(f"{what(n)} reshapes across a padded axis")

    def _index(self, n, args, kwargs):
        """x[...]: whole along each padded axis, or its last k (`-k:`), read at the call's end."""
        x, index = n.args
        pads = padded_axes(x)
        if not pads:
            return self._copy(n, args, kwargs)
        index = list(index) if isinstance(index, tuple) else [index]
        rank = example(x).dim()
        used = sum(1 for i in index if i is not None and i is not Ellipsis)
        d = out = 0
        tails = []                                        # (output axis, k, the axis's size)
        for j, i in enumerate(index):
            if isinstance(i, slice):
                stop = fixed(i.stop)
                if d in pads and isinstance(example(stop), torch.SymInt) and \
                        fixed(i.start) in (None, 0) and fixed(i.step) in (None, 1):
                    # `:t` (a mask cut to the keys): the bucket's t, its rows past t padding
                    stop = self.static(example(stop).node.expr)
                    if stop > self.static(pads[d]):
                        raise Refused(f"{what(n)} slices past a padded axis")
                    stop = None if stop == self.static(pads[d]) else stop
                    if stop is not None:
                        index[j] = slice(None, stop)
                        d, out = d + 1, out + 1
                        continue
                i = index[j] = slice(fixed(i.start), stop, fixed(i.step))
            if i is Ellipsis:
                d, out = d + rank - used, out + rank - used
            elif i is None:
                out += 1
            elif isinstance(i, slice) and d in pads and i.stop is None and i.step in (None, 1) and (
                    i.start is None or i.start == 0 or isinstance(i.start, int) and i.start < 0):
                if isinstance(i.start, int) and i.start < 0:
                    tails.append((out, -i.start, pads[d]))
                    index[j] = slice(None)
                d, out = d + 1, out + 1
            elif d in pads or isinstance(i, fx.Node):
                raise Refused(f"{what(n)} indexes along a padded axis")
            else:
                d, out = d + 1, out + (0 if isinstance(i, int) else 1)
        got = self._copy(n, (args[0], tuple(index) if len(index) != 1 else index[0]), kwargs)
        for axis, k, e in tails:
            at = self.g.call_function(torch.arange, (k,), {"device": example(n).device})
            at = self.g.call_function(operator.add, (at, self.runtime(e - k)))
            got = self.g.call_method("index_select", (got, axis, at))
        return got

    def _valid(self, n, axes: dict[int, sympy.Expr], rank: int):
        """A boolean node, true within the call's sizes along `axes` of a rank-`rank` tensor."""
        device = example(n).device
        mask = None
        for d, e in axes.items():
            shape = [1] * rank
            shape[d] = self.static(e)
            at = self.g.call_function(torch.arange, (shape[d],), {"device": device})
            ok = self.g.call_method("view", (self.g.call_function(operator.lt, (at, self.runtime(e))), shape))
            mask = ok if mask is None else self.g.call_function(operator.and_, (mask, ok))
        return mask

    def _masked(self, n, x_new, x_old, axes, fill):
        if not axes:
            return x_new
        dt = example(x_old).dtype
        if fill in ("-inf", "inf"):
            fill = float(fill) if dt.is_floating_point else (torch.iinfo(dt).min if fill == "-inf" else torch.iinfo(dt).max)
        return self.g.call_function(torch.where, (self._valid(n, axes, example(x_old).dim()), x_new, fill))

    def _reduce(self, n, key, args, kwargs):
        x = n.args[0]
        rank = example(x).dim()
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if key in (F.softmax, torch.softmax, "softmax", F.log_softmax, torch.log_softmax, "log_softmax") and dim is None:
            raise Refused(f"{what(n)} without a dim")
        dims = range(rank) if dim is None or dim == [] or dim == () else [dim] if isinstance(dim, int) else dim
        dims = sorted(d % rank for d in dims)
        axes = {d: e for d, e in padded_axes(x).items() if d in dims}
        if not axes:
            return self._copy(n, args, kwargs)
        masked = self._masked(n, args[0], x, axes, REDUCTIONS[key])
        if key not in (torch.mean, "mean"):
            return self._copy(n, (masked, *args[1:]), kwargs)
        if kwargs.get("dtype") is not None:
            raise Refused(f"{what(n)} with a dtype")
        keep = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
        total = self.g.call_method("sum", (masked, dims), {"keepdim": keep})
        count = 1
        for d in dims:
            size = self.runtime(axes[d]) if d in axes else int(example(x).shape[d])
            count = size if count == 1 else self.g.call_function(operator.mul, (count, size))
        return self.g.call_function(operator.truediv, (total, count))

    def _contract(self, n, key, args, kwargs):
        a, b = n.args[0], n.args[1]
        ka = example(a).dim() - 1
        kb = example(b).dim() - (1 if key in LINEARS or example(b).dim() == 1 else 2)
        ea, eb = padded_axes(a).get(ka), padded_axes(b).get(kb)
        if ea is None and eb is None:
            return self._copy(n, args, kwargs)
        e = ea if ea is not None else eb
        ma = self._masked(n, args[0], a, {ka: e}, 0)
        mb = self._masked(n, args[1], b, {kb: e}, 0)
        return self._copy(n, (ma, mb, *args[2:]), kwargs)

    def _attention(self, n, args, kwargs):
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal"]
        given = {**dict(zip(names, n.args)), **n.kwargs}
        k = given["key"]
        e = padded_axes(k).get(example(k).dim() - 2)
        if e is None:
            return self._copy(n, args, kwargs)
        k_rank = example(k).dim()
        # the padding's keys and values read as 0: a score or a product of NaN is NaN
        key = self._masked(n, args[1], k, {k_rank - 2: e}, 0)
        val = self._masked(n, args[2], given["value"], {k_rank - 2: e}, 0)
        rest = self._args({m: v for m, v in given.items() if m not in names[:4]}, value=False)
        if given.get("is_causal"):
            # query i reads keys up to i: within the call's keys for every query within its own,
            # when both are padded alike (torch takes no mask beside is_causal)
            if padded_axes(given["query"]).get(example(given["query"]).dim() - 2) != e:
                raise Refused(f"{what(n)}: causal attention over padded keys")
            return self._copy(n, (args[0], key, val), rest)
        rank = example(n).dim()
        valid = self._valid(n, {rank - 1: e}, rank)
        mask = self._args(given.get("attn_mask"), value=False)
        if mask is None:
            mask = self.g.call_function(torch.where, (valid, 0.0, float("-inf")))
            dt = example(given["query"]).dtype
            mask = self.g.call_method("to", (mask, dt))
        elif example(given["attn_mask"]).dtype == torch.bool:
            mask = self.g.call_function(operator.and_, (mask, valid))
        else:
            mask = self.g.call_function(torch.where, (valid, mask, float("-inf")))
        return self._copy(n, (args[0], key, val), {**rest, "attn_mask": mask})

    def _cat(self, n, args, kwargs):
        pieces = n.args[0]
        dim = kwargs.get("dim", args[1] if len(args) > 1 else 0) % example(n).dim()
        along = [i for i, p in enumerate(pieces) if dim in padded_axes(p)]
        self._check_aligned(n, pieces, along=dim)
        if not along:
            return self._copy(n, args, kwargs)
        if len(along) > 1:
            raise Refused(f"{what(n)} joins several padded pieces")
        j = along[0]
        out = self._copy(n, args, kwargs)
        tail = pieces[j + 1:]
        if not tail:
            return out
        if any(dim in padded_axes(p) for p in tail):
            raise Refused(f"{what(n)} joins several padded pieces")
        k = sum(int(example(p).shape[dim]) for p in tail)
        start = sum(example(p).shape[dim] for p in pieces[:j + 1])      # a SymInt expression
        offset = self.runtime(_expr(start))
        at = self.g.call_function(torch.arange, (k,), {"device": example(n).device})
        at = self.g.call_function(operator.add, (at, offset))
        rest = self.env[tail[0]] if len(tail) == 1 else self.g.call_function(
            torch.cat, ([self.env[p] for p in tail], dim))
        return self.g.call_method("index_copy", (out, dim, at, rest))

    def _index_copy(self, n, args, kwargs):
        """dest.index_copy_(dim, index, source) (a static KV cache's update) of rows padded along
        the index: the padded entries repeat the call's last row and its position, so they write
        again what that row wrote (the same value: nothing else)."""
        if kwargs or len(n.args) != 4:
            raise Refused(f"{what(n)} on a padded tensor, its arguments named")
        dest, dim, index, source = n.args
        if set(padded_axes(index)) - {0}:
            raise Refused(f"{what(n)} on a padded tensor")
        dim %= example(dest).dim()
        self._check_aligned(n, [dest], along=dim)
        if not padded_axes(index) and dim not in padded_axes(source):
            return self._copy(n, args, kwargs)       # real rows at real positions (a decode step)
        count = padded_axes(index)[0]
        if set(padded_axes(source)) != {dim} or padded_axes(source)[dim] != count:
            raise Refused(f"{what(n)}: its rows are not padded as its index is")
        rows = self.g.call_function(torch.arange, (self.static(count),),
                                    {"device": example(index).device})
        last = self.g.call_function(operator.sub, (self.runtime(count), 1))
        rows = self.g.call_function(torch.clamp, (rows,), {"max": last})
        index = self.g.call_method("index_select", (args[2], 0, rows))
        source = self.g.call_method("index_select", (args[3], dim, rows))
        return self._copy(n, (args[0], dim, index, source), {})


def _sizes_only(n) -> bool:
    """A creation whose size arguments are all it takes from a symbol (arange(end), zeros(size))."""
    def sym(x):
        return isinstance(x, fx.Node) and is_symbolic(example(x))
    if n.target is torch.arange:
        return len(n.args) == 1 and not any(sym(v) for v in n.kwargs.values())
    if n.target is torch.full:
        return not sym(n.args[1] if len(n.args) > 1 else n.kwargs.get("fill_value"))
    return True


def _expr(s):
    return s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(s)
