"""A linear's weight computed from weights, row by row: a QuantLinear's dequantization, so that
sibling quantized projections merge as float ones do (tensor/merge_projections.py).

Why: a quantized q, k and v projection each dequantize their own blocks (bitwise ops, casts, a
scale per block, a view to [N, K]) and multiply one activation, so a decode step ran three kernels
and three activation prologues where a float model runs one. Each node of such a chain keeps the
weight's rows as its leading dimension (every tensor it reads and makes has N rows, and no op
mixes rows: elementwise, casts, views and concatenations or slices along another dimension), so
the chains of siblings that compute the same way concatenate: the merged chain reads each of the
members' weights concatenated along N and computes the members' weights concatenated.
"""
from __future__ import annotations

import dataclasses

import torch.utils._pytree as pytree

from ..frontend.torch_ir import Ref, TorchNode, TorchProgram, TorchType

ROW_LOCAL = {"aten.__and__", "aten.__or__", "aten.__rshift__", "aten.__lshift__",
             "aten.bitwise_and", "aten.bitwise_or", "aten.bitwise_right_shift",
             "aten.bitwise_left_shift", "aten._to_copy", "aten.to", "aten.sub", "aten.mul", "aten.add",
             "aten.neg", "aten.view", "aten.reshape", "aten._unsafe_view", "aten.cat",
             "aten.slice", "aten.unsqueeze"}
SIZED = {"aten.view", "aten.reshape", "aten._unsafe_view"}     # args[1]: sizes, [N, ...]
ALONG = {"aten.cat": 1, "aten.slice": 1, "aten.unsqueeze": 1}   # the dimension's argument


@dataclasses.dataclass(frozen=True)
class Chain:
    nodes: tuple            # the nodes computing the weight, in program order (the last is it)
    weights: tuple          # the weights they read, in order of first use
    signature: tuple        # what they compute, with the weights and N left out


def weight_chain(prog: TorchProgram, name: str, users: dict, linear: str,
                 by_name: dict) -> Chain | None:
    """The chain computing node `name` (the weight of node `linear`) from weights alone, row-local
    along its N rows (see the module docstring) and read by nothing outside it but `linear`;
    else None. users: readers(prog); by_name: the program's nodes by name."""
    if name not in by_name or not isinstance(by_name[name].type, TorchType):
        return None
    rows, found, todo = by_name[name].type.shape[0], set(), [name]
    while todo:
        node = by_name.get(todo.pop())
        if node is None or node.name in found:
            continue
        if not _row_local(node, rows, prog, by_name):
            return None
        found.add(node.name)
        todo += [r.name for r in _refs((node.args, node.kwargs)) if r.name not in prog.weight_types]
    if any(set(users.get(n, ())) - found - {linear} for n in found):
        return None
    nodes = tuple(n for n in prog.nodes if n.name in found)
    weights = tuple(dict.fromkeys(r.name for n in nodes for r in _refs((n.args, n.kwargs))
                                  if r.name in prog.weight_types))
    index = {n.name: i for i, n in enumerate(nodes)}
    sig = tuple((n.op, _norm(n.args, index, weights, n.packet in SIZED),
                 _norm(n.kwargs, index, weights, False),
                 n.type.dtype, n.type.shape[1:]) for n in nodes)
    return Chain(nodes, weights, (tuple((prog.weight_types[w].dtype, prog.weight_types[w].shape[1:])
                                         for w in weights), sig))


def merged_chain(chains: list[Chain], weight_names: list[str], suffix: str,
                 taken: set) -> list[TorchNode]:
    """The first chain's nodes renamed (`suffix`, apart from `taken`), reading `weight_names` (the
    members' weights concatenated, in the order of Chain.weights) and making all their rows."""
    first, rows = chains[0], sum(c.nodes[-1].type.shape[0] for c in chains)
    names, out = dict(zip(first.weights, weight_names)), []
    for node in first.nodes:
        new = f"{node.name}{suffix}"
        while new in taken:
            new += "_"
        taken.add(new)
        args = _renamed(node.args, names)
        if node.packet in SIZED:
            args = (args[0], [rows, *args[1][1:]], *args[2:])
        out.append(dataclasses.replace(node, name=new, args=args,
                                       kwargs=_renamed(node.kwargs, names),
                                       type=TorchType((rows, *node.type.shape[1:]), node.type.dtype)))
        names[node.name] = new
    return out


def _row_local(node: TorchNode, rows: int, prog: TorchProgram, by_name: dict) -> bool:
    t = node.type
    if node.packet not in ROW_LOCAL or not isinstance(t, TorchType) or len(t.shape) < 2 \
            or t.shape[0] != rows:
        return False
    for r in _refs((node.args, node.kwargs)):
        typ = prog.weight_types.get(r.name) or getattr(by_name.get(r.name), "type", None)
        if not isinstance(typ, TorchType) or len(typ.shape) < 1 or typ.shape[0] != rows:
            return False
    if node.packet in SIZED and not (isinstance(node.args[1], (list, tuple)) and node.args[1]
                                     and node.args[1][0] == rows):
        return False
    if node.packet in ALONG:
        dim = node.args[ALONG[node.packet]] if len(node.args) > ALONG[node.packet] else 0
        if not isinstance(dim, int) or dim % len(t.shape) == 0:
            return False
    return True


def readers(prog: TorchProgram) -> dict:
    """node or weight name -> the names of the nodes that read it ("<output>": the program)."""
    out: dict[str, list[str]] = {}
    for node in prog.nodes:
        for r in _refs((node.args, node.kwargs)):
            out.setdefault(r.name, []).append(node.name)
    for name in prog.outputs:
        out.setdefault(name, []).append("<output>")
    return out


def _refs(args) -> list[Ref]:
    return [a for a in pytree.tree_leaves(args) if isinstance(a, Ref)]


def _norm(a, index: dict, weights: tuple, sized: bool) -> str:
    """a with node refs as their place in the chain, weight refs as their place in `weights`,
    and (sized: a view's) the leading size left out."""
    a = pytree.tree_map(lambda x: (("n", index[x.name]) if x.name in index else
                                   ("w", weights.index(x.name))) if isinstance(x, Ref) else x, a)
    return repr((a[0], ["N", *a[1][1:]], *a[2:]) if sized else a)


def _renamed(a, names: dict):
    return pytree.tree_map(lambda x: Ref(names.get(x.name, x.name)) if isinstance(x, Ref) else x, a)
