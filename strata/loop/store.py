"""The STORE decision: values a kernel computes again that a kernel of their own could store once.

The fusion planner inlines every elementwise value into each kernel that reads it (fuse.py).
Where a kernel computes a point of one many times (RoPE's cos and sin of the angles, broadcast
over the heads; a causal mask made from positions, in every layer's scores), storing it once
can be much faster; where it is cheap, the store's traffic loses. Which is a measurement, so it
is a knob, pinned per kernel signature like the schedule's and searched by `strata tune`.
"""
from __future__ import annotations

from math import prod

from ..core.context import Context
from ..core.expr import free_vars
from ..core.scalar_ops import TRANSCENDENTAL
from .ir import LoopProgram, signature


def recomputed(elementwise: dict, shape: tuple, outer: tuple) -> tuple[tuple[str, int], ...]:
    """KernelPlan.inline from the walk's {value: indices it is read at}: how many times the
    kernel computes each point of each: once per index, times the parallel (outer) axes it
    does not depend on and the inner loops it does not depend on that enclose one it does (the
    builder hoists a value out of the inner loops below its last)."""
    inner = [d for d, s in enumerate(shape) if s > 1 and d not in outer]
    out = []
    for x, at in elementwise.items():
        deps = {int(v[1:]) for i in at for e in i for v in free_vars(e)
                if v[0] == "o" and v[1:].isdigit()}
        last = max((k for k, d in enumerate(inner) if d in deps), default=-1)
        missing = [d for d in outer if d not in deps] + [d for d in inner[:last] if d not in deps]
        out.append((x, len(at) * prod(shape[d] for d in missing)))
    return tuple(out)


def store_choices(prog, plans: list, pos: dict, materialized: set[str]
                  ) -> dict[str, tuple[str, ...]]:
    """{kernel target: the values it computes again (read at several indices, broadcast over
    axes it does not depend on, or computed by other kernels too) that no such value reads
    (the mask, not the positions it is made of), costliest first: times computed by the work
    of its inline cone, a transcendental counting 8 operations}."""
    plans = [k for k in plans if getattr(k, "inline", ())]
    users: dict[str, int] = {}
    for k in plans:
        for x, _ in k.inline:
            users[x] = users.get(x, 0) + 1
    out = {}
    for k in plans:
        inline = dict(k.inline)

        def cone(x: str) -> set[str]:
            seen, stack = set(), [x]
            while stack:
                y = stack.pop()
                if y not in materialized and y not in seen:
                    seen.add(y)
                    stack.extend(prog.node(y).operands())
            return seen & inline.keys()

        def work(x: str) -> int:
            return sum(8 if prog.node(y).op in TRANSCENDENTAL else 1 for y in cone(x))
        again = [x for x, times in k.inline if times * users[x] > 1]
        below = set().union(*(cone(x) - {x} for x in again))     # stored with one above them
        chosen = sorted((x for x in again if x not in below),
                        key=lambda x: (-inline[x] * users[x] * work(x), pos[x]))
        if chosen:
            out[k.target] = tuple(chosen)
    return out


def store_decisions(loop: LoopProgram, choices: dict, ctx: Context) -> dict[str, tuple[int, str]]:
    """{kernel target: (its STORE value, its signature)} for the kernels with values to store;
    STORE=n stores the first n. Looked up by signature, so a tuned value follows a layer's
    kernel into every layer."""
    buffers = {b.name: b for b in loop.buffers}
    out = {}
    for k in loop.kernels:
        t = k.writes[0] if k.writes else None
        if t not in choices or t in out:
            continue
        sig = signature(k, buffers)
        kctx, _ = ctx.for_kernel(sig)
        out[t] = (min(kctx.knob("STORE", 0), len(choices[t])), sig)   # more than it has: all
    return out
