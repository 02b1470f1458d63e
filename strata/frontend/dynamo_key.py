"""Which dynamo graphs, called with which inputs, are the same strata program.

Why: dynamo compiles one frame into several graphs that differ only in what they leave symbolic.
transformers' decode step is traced with static shapes first and, once the KV cache has grown,
again with the cache length as a SymInt; at the next `generate` the newer, dynamic graph takes
the lengths the static one already serves. Keyed by graph identity, each new (graph, shapes)
pair would be captured and compiled again; keyed by this key, it reuses the program.

The key is the graph specialised to the call: every int-valued node (a SymInt input, `x.size(1)`,
`torch.sym_sum`) is replaced by its value for these inputs, worked out from the symbols that the
inputs' sizes bind, and tensor nodes are named by position, not by dynamo's names. Two graphs
with equal keys compute the same thing from the same tensors; weights are keyed by storage, so
two layers' graphs with the same structure stay apart, and so are the graph's own tensor
attributes (a constant index such as x[[0, 3]]'s: two graphs that differ only in its values
shared one program before, and the second computed the first's indexing).
"""
from __future__ import annotations

import sympy
import torch


class Unkeyable(Exception):
    """A size the inputs do not determine (a data-dependent one): no key."""


def graph_key(gm: torch.fx.GraphModule, args, weights: set[int], attrs: bool = True) -> tuple | None:
    """The key of `gm` called on `args` (weights: the positions of inputs compiled as weights),
    or None when some int in the graph is not fixed by the inputs. attrs=False keys the graph's
    tensor attributes by name only (torch_compile/saved_graphs.py hashes their bytes itself)."""
    try:
        return _key(gm, args, weights, attrs)
    except Unkeyable:
        return None


def _attr(gm, target: str) -> tuple:
    """A tensor attribute's storage, shape and dtype (what its values live in), else ()."""
    value = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.data_ptr())
    return ()


def _key(gm, args, weights, attrs: bool = True) -> tuple:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    bound = _bound_symbols(placeholders, args)
    value: dict = {}            # int-valued node -> its value for these inputs
    index: dict = {}            # tensor (or side-effect) node -> its position in the key
    key = []
    for pos, (n, a) in enumerate(zip(placeholders, args)):
        if isinstance(a, torch.Tensor):
            index[n] = len(key)
            key.append(("in", tuple(a.shape), a.dtype, a.device.type,
                        a.data_ptr() if pos in weights else None))
        else:
            value[n] = a
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            if n.op == "get_attr":
                index[n] = len(key)
                key.append(("attr", n.target) + (_attr(gm, n.target) if attrs else ()))
            continue
        if n.op == "output":
            key.append(("out", _token(n.args, value, index)))
            continue
        example = n.meta.get("example_value")
        if isinstance(example, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            value[n] = _evaluate(example, bound)
            continue
        index[n] = len(key)
        key.append((n.op, _target(n.target), _token(n.args, value, index),
                    _token(tuple(sorted(n.kwargs.items())), value, index)))
    return tuple(key)


def _bound_symbols(placeholders, args) -> dict:
    """{sympy symbol: int}: what each symbol of the graph is for these inputs (a SymInt input's,
    or a tensor input's size)."""
    bound = {}
    for n, a in zip(placeholders, args):
        example = n.meta.get("example_value")
        if isinstance(example, torch.SymInt) and isinstance(example.node.expr, sympy.Symbol):
            bound[example.node.expr] = a
        elif isinstance(example, torch.Tensor) and isinstance(a, torch.Tensor):
            for s, v in zip(example.shape, a.shape):
                if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                    bound[s.node.expr] = v
    return bound


def _evaluate(example, bound):
    if not isinstance(example, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return example
    expr = example.node.expr.xreplace({k: sympy.Integer(v) for k, v in bound.items()})
    if expr.free_symbols:
        raise Unkeyable
    kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(example)]
    return kind(expr)


def _target(target) -> str:
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', repr(target))}"


def _token(a, value, index):
    if isinstance(a, torch.fx.Node):
        if a in value:
            return _constant(value[a])
        if a not in index:
            raise Unkeyable
        return ("n", index[a])
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, *(_token(x, value, index) for x in a))
    if isinstance(a, dict):
        return ("dict", *((k, _token(v, value, index)) for k, v in a.items()))
    if isinstance(a, slice):
        return ("slice", *(_token(x, value, index) for x in (a.start, a.stop, a.step)))
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unkeyable
    return _constant(a)


def _constant(a):
    """A literal and an int node of the same value are the same token (a static graph's 5 is
    the dynamic graph's s0 + 1)."""
    return ("k", type(a).__name__, repr(a))
