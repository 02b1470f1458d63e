"""A hand-written kernel's place in Loop IR: planned apart from fusion (fuse.py), one kernel of
one `CustomCall` statement whose operands are buffers."""
from __future__ import annotations

from dataclasses import dataclass

from .ir import CustomCall, LoopKernel


@dataclass
class CustomPlan:
    """fuse.py's plan entry for a Custom node (KernelPlan's counterpart)."""
    target: str
    reduces: tuple = ()
    merged: tuple = ()

    def build(self, prog, materialized: set, name: str, alias: dict | None = None) -> LoopKernel:
        n, alias = prog.node(self.target), alias or {}
        args = tuple(alias.get(a, a) if isinstance(a, str) else a for a in n.args)
        out = alias.get(n.name, n.name)
        reads = tuple(dict.fromkeys(a for a in args if isinstance(a, str)))
        call = CustomCall(n.op, args, out, n.type.dtype, n.kernel)
        return LoopKernel(name, (call,), reads, (out,), src=n.src)


def custom_of(k) -> CustomCall | None:
    """The CustomCall of a kernel made by CustomPlan, else None."""
    body = getattr(k, "body", ())
    return body[0] if len(body) == 1 and isinstance(body[0], CustomCall) else None
