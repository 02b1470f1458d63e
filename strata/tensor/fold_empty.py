"""Tensors with zero elements, settled in Tensor IR so that no later stage sees an empty loop.

Why here: a node with no elements needs no kernel, and a reduction over an axis of extent 0 has
a value that does not depend on its operand (eager's: 0 for sum, 1 for prod; mean = sum / 0 is
NaN downstream). Both become `Full` nodes; loop lowering then launches nothing for an empty
output (loop/lower.py drops kernels that write only empty buffers). Eager itself refuses
max/min/argmax over an empty axis, so torch.export never hands those to strata.
"""
from __future__ import annotations

from ..core import dtypes
from .ir import Full, Input, Node, Reduce

IDENTITY = {"sum": 0, "prod": 1}


def _folded(n: Node, by_name: dict[str, Node]) -> Node:
    if isinstance(n, Input):
        return n
    if n.type.numel == 0:
        return Full(n.name, n.type, src=n.src, value=0)
    if isinstance(n, Reduce) and by_name[n.arg].type.numel == 0 and n.op in IDENTITY:
        value = IDENTITY[n.op]
        return Full(n.name, n.type, src=n.src, value=float(value) if dtypes.is_float(n.type.dtype) else value)
    return n


def fold_empty(nodes: list[Node]) -> list[Node]:
    """`nodes` with every empty node, and every reduction over an empty axis, made a Full
    (their operands may then be dead: the caller prunes)."""
    if not any(n.type.numel == 0 for n in nodes):
        return nodes
    out, by_name = [], {}
    for n in nodes:
        n = _folded(n, by_name)
        by_name[n.name] = n
        out.append(n)
    return out
