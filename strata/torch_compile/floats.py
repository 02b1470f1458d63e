"""dynamo's unspecialised floats read as the call's constants.

Why: with `dynamic=True` dynamo passes a module's float attributes (RMSNorm's eps, the rotary
embedding's scaling, an embedding's norm_type, attention's scale) as 0-d float64 tensors that the
graph reads with `.item()`, a symbolic float from then on. strata compiles sizes, not scalars
read from data (aten.item), so such a graph failed. A graph reading floats so is compiled per set
of their values instead: each read, and each value computed from the reads alone, becomes the
call's number, and a call with other values takes (or makes) the program of those. A module's
constants never change, so one program serves them; a float that changes at every call (a
learning rate given as a float) compiles at every call, which StrataGraph warns of: pass it as a
tensor.
"""
from __future__ import annotations

import sympy
import torch
from torch import fx

from .padded_graph import SYMBOLIC

_READS = ("item",)                     # call_method targets that read a 0-d tensor as a number


def float_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the graph inputs that are 0-d floating tensors read only by `.item()`."""
    out = []
    holders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(holders):
        v = n.meta.get("example_value")
        if isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point() and n.users \
                and all(u.op == "call_method" and u.target in _READS for u in n.users):
            out.append(i)
    return out


def specialise(gm: fx.GraphModule, positions: list[int], values: tuple[float, ...]) -> fx.GraphModule:
    """`gm` with the reads of the inputs at `positions` (and what is computed from them alone)
    replaced by the numbers they are at this call (`values`, in order)."""
    graph = fx.Graph()
    nodes: dict = {}
    graph.output(graph.graph_copy(gm.graph, nodes))     # (graph_copy leaves the output out)
    holders = [n for n in graph.nodes if n.op == "placeholder"]
    bound = {}
    for i, value in zip(positions, values):
        for read in holders[i].users:
            if isinstance(symbol := read.meta["example_value"].node.expr, sympy.Symbol):
                bound[symbol] = sympy.Float(value)
    folded = []
    for n in graph.nodes:
        v = n.meta.get("example_value")
        if not isinstance(v, SYMBOLIC):
            continue
        expr = v.node.expr
        if not expr.free_symbols or not expr.free_symbols <= set(bound):
            continue
        number = expr.xreplace(bound)
        kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(v)]
        for user in list(n.users):
            user.replace_input_with(n, kind(number))
        folded.append(n)
    for n in reversed(folded):
        graph.erase_node(n)
    return fx.GraphModule(gm, graph)
