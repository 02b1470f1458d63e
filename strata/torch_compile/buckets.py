"""A shape-dynamic dynamo graph run by one program per bucket of sizes, not one per size.

Under transformers' dynamic KV cache each decode step has another cache length, so after its
first recompile dynamo hands over a graph whose sizes hold a symbol (`s40`, the cache length);
a second prompt length does the same to the prefill. A program per length costs seconds per
token on a whole model. Instead each symbol is rounded up to a bucket (`capacity`: a power of
two, at least MIN) and the graph rewritten to compute exactly at that capacity
(padded_graph.py); at a call (`Padded`) its tensors are copied into buffers of the bucket's
sizes, its sizes passed as values, and the outputs narrowed back and made contiguous, as eager's
(dynamo guards the next call's strides: narrowed views made it recompile at every step). A graph
the rewrite refuses gets a program per size, as before, with the reason said at verbosity 1.
"""
from __future__ import annotations

import sympy
import torch
import torch.utils._pytree as pytree
from torch import fx

from .padded_graph import PaddedGraph, Refused, example, padded_axes

MIN = 64
FILL = None         # what a padded input's padding holds: None leaves it as allocated (tests: NaN)


def capacity(value: int) -> int:
    """The bucket a size falls in: the next power of two, at least MIN."""
    return max(MIN, 1 << max(value - 1, 0).bit_length())


class Padded:
    """The plan of one shape-dynamic graph: where each symbol's value is read at a call, and the
    graph rewritten for a bucket (`graph(caps)`); raises Refused when it cannot be."""

    def __init__(self, gm: fx.GraphModule):
        self.gm = gm
        holders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.symbols: dict[sympy.Symbol, tuple] = {}      # symbol -> (position, axis or None)
        for i, n in enumerate(holders):
            v = example(n)
            if v is None:
                raise Refused(f"graph input {n.name} has no example value")
            if isinstance(v, torch.SymInt) and isinstance(v.node.expr, sympy.Symbol):
                self.symbols.setdefault(v.node.expr, (i, None))
            for d, e in padded_axes(n).items():
                if isinstance(e, sympy.Symbol):
                    self.symbols.setdefault(e, (i, d))
        self.sym_positions = {i for i, n in enumerate(holders) if isinstance(example(n), torch.SymInt)}
        # what a call computes from its sizes, as functions of the symbols' values (in order)
        order = list(self.symbols)

        def size(e):
            if not e.free_symbols <= set(order):
                raise Refused(f"size {e} is not read from any input")
            f = sympy.lambdify(order, e, modules="math")
            return lambda values: int(f(*values))
        self.pad_inputs = {i: {d: size(e) for d, e in padded_axes(n).items()}
                           for i, n in enumerate(holders) if padded_axes(n)}
        out = next(n for n in gm.graph.nodes if n.op == "output")
        self.out_leaves = []      # per leaf: ("input", position) | ("size", f) | ("narrow", {axis: f}) | None
        for leaf in pytree.tree_flatten(out.args[0])[0]:
            v = example(leaf)
            if isinstance(leaf, fx.Node) and leaf.op == "placeholder":
                self.out_leaves.append(("input", holders.index(leaf)))
            elif isinstance(v, torch.SymInt):
                self.out_leaves.append(("size", size(v.node.expr)))
            elif axes := padded_axes(leaf):
                self.out_leaves.append(("narrow", {d: size(e) for d, e in axes.items()}))
            else:
                self.out_leaves.append(None)
        PaddedGraph(gm, self.symbols, {s: capacity(2) for s in self.symbols})      # refused now, not per call

    def values(self, args) -> tuple[int, ...]:
        """The symbols' values at a call, in `self.symbols` order."""
        return tuple(int(args[i] if d is None else args[i].shape[d]) for i, d in self.symbols.values())

    def caps(self, values) -> tuple[int, ...]:
        return tuple(capacity(v) for v in values)

    def graph(self, caps) -> fx.GraphModule:
        """The graph at these capacities: SymInt inputs gone, one 0-d int64 input per symbol
        appended (in `self.symbols` order)."""
        return PaddedGraph(self.gm, self.symbols, dict(zip(self.symbols, caps))).module

    def inputs(self, args, values, caps, device) -> list:
        """The rewritten graph's inputs for a call: padded tensors, then the symbols' values."""
        out = []
        for i, a in enumerate(args):
            if i in self.sym_positions:
                continue
            if axes := self.pad_inputs.get(i):
                shape = [axes[d](caps) if d in axes else n for d, n in enumerate(a.shape)]
                # integers read as 0 (an embedding's index stays in its table); floats as FILL
                buf = (a.new_zeros(shape) if not a.is_floating_point() else
                       a.new_empty(shape) if FILL is None else a.new_full(shape, FILL))
                buf[tuple(slice(0, n) for n in a.shape)] = a
                a = buf
            out.append(a)
        return out + [torch.tensor(v, device=device) for v in values]

    def outputs(self, flat: list, args, values) -> list:
        """dynamo's output leaves from the rewritten graph's: narrowed to the call's sizes and
        contiguous, as eager's (dynamo guards the next call's strides), an input returned as is
        given back as the caller's tensor, a size as the call's."""
        leaves = []
        for how, got in zip(self.out_leaves, flat):
            if how is not None and how[0] == "input":
                got = args[how[1]]
            elif how is not None and how[0] == "size":
                got = how[1](values)
            elif how is not None:
                for d, f in how[1].items():
                    got = got.narrow(d, 0, f(values))
                got = got.contiguous()
            leaves.append(got)
        return leaves
