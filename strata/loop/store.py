"""The STORE decision: values a kernel computes again that a kernel of their own could store once.

The fusion planner inlines every elementwise value into each kernel that reads it (fuse.py).
Where a kernel computes a point of one many times (RoPE's cos and sin of the angles, broadcast
over the heads; a causal mask made from positions, in every layer's scores), storing it once
can be much faster; where it is cheap, the store's traffic loses. Which is a measurement, so it
is a knob, pinned per kernel signature like the schedule's and searched by `strata tune`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import takewhile
from math import prod

from ..core.context import Context
from ..core.expr import free_vars
from ..core.scalar_ops import TRANSCENDENTAL
from .ir import LoopProgram, signature


@dataclass(frozen=True)
class Stores:
    """A kernel's STORE choices: the values, costliest first, and how many of them a CPU stores
    by default (_by_rule; a GPU none: not measured there)."""
    values: tuple[str, ...]
    by_rule: int


def recomputed(elementwise: dict, shape: tuple, outer: tuple) -> tuple[tuple[str, int, bool], ...]:
    """KernelPlan.inline from the walk's {value: (index, inside a reduction) it is read at}:
    how many times the kernel computes each point of each, summed over its indices: the
    parallel (outer) axes an index does not depend on, times the inner loops it does not depend
    on that enclose one it does (the builder hoists a value out of the inner loops below its
    last); and whether it is read inside a reduction."""
    inner = [d for d, s in enumerate(shape) if s > 1 and d not in outer]
    out = []
    for x, at in elementwise.items():
        times = 0
        for index, _ in at:
            deps = {int(v[1:]) for e in index for v in free_vars(e) if v[0] == "o" and v[1:].isdigit()}
            last = max((k for k, d in enumerate(inner) if d in deps), default=-1)
            times += prod(shape[d] for d in [d for d in outer if d not in deps] +
                          [d for d in inner[:last] if d not in deps])
        out.append((x, times, any(inside for _, inside in at)))
    return tuple(out)


def store_choices(prog, plans: list, pos: dict, materialized: set[str]) -> dict[str, Stores]:
    """{kernel target: the values it computes again (read at several indices, broadcast over
    axes it does not depend on, or computed by other kernels too) that no such value computed
    by as many kernels reads (the mask, not the positions it is made of): those the CPU rule
    stores first, then the rest, each costliest first: times computed by the work of its
    inline cone, a transcendental counting 8 operations}."""
    plans = [k for k in plans if getattr(k, "inline", ())]
    users = Counter(x for k in plans for x, _, _ in k.inline)       # kernels computing each
    out = {}
    for k in plans:
        inline = {x: times for x, times, _ in k.inline}
        cone = {x: _cone(prog, x, materialized) & inline.keys() for x in inline}
        work = {x: sum(8 if prog.node(y).op in TRANSCENDENTAL else 1 for y in c)
                for x, c in cone.items()}
        # inside a reduction, only one with a transcendental: a contraction's computed operand
        # is the schedule's PROLOGUE decision (its rows stored or computed per block)
        again = [x for x, times, inside in k.inline
                 if times * users[x] > 1 and (not inside or work[x] >= 8)]
        # a value below another is stored with it, unless more kernels compute it (RoPE's cos
        # under one layer's rotated q, in every layer)
        below = {y for x in again for y in cone[x] - {x} if users[y] <= users[x]}
        # the rule's values first (STORE=n stores n): not behind a model's positions (an iota)
        size = prod(prog.node(k.target).type.shape)
        chosen = sorted((x for x in again if x not in below),
                        key=lambda x: (not _by_rule(prog, x, inline[x] * users[x], cone[x], size),
                                       -inline[x] * users[x] * work[x], pos[x]))
        rule = takewhile(lambda x: _by_rule(prog, x, inline[x] * users[x], cone[x], size), chosen)
        if chosen:
            out[k.target] = Stores(tuple(chosen), len(list(rule)))
    return out


def _cone(prog, x: str, materialized: set[str]) -> set[str]:      # x and what makes it
    seen, stack = set(), [x]
    while stack:
        y = stack.pop()
        if y not in materialized and y not in seen:
            seen.add(y)
            stack.extend(prog.node(y).operands())
    return seen


def _by_rule(prog, x: str, times: int, cone: set[str], size: int) -> bool:
    """Whether a CPU stores x by default: a transcendental in it, computed at least 16 times a
    point, and at most an eighth of the kernel's output (RoPE's cos and sin, shared by every
    layer: TinyLlama's 128-token prefill 1.04x, a RoPE from angles 18x; a causal mask or a
    softmax's exp rows are left to the search)."""
    return times >= 16 and 8 * prod(prog.node(x).type.shape) <= size \
        and any(prog.node(y).op in TRANSCENDENTAL for y in cone)


def store_decisions(loop: LoopProgram, choices: dict, ctx: Context
                    ) -> tuple[dict[str, int], dict[str, str]]:
    """({kernel target: its STORE value}, {loop kernel: its signature}) for the kernels with
    values to store; STORE=n stores the first n (default: Stores.by_rule on a CPU, none on a
    GPU). Looked up by signature, so a tuned value follows a layer's kernel into every layer."""
    default = {t: 0 if ctx.arch.is_gpu else c.by_rule for t, c in choices.items()}
    if not (ctx.kernel_knobs or ctx.tuned or ctx.pinned("STORE")):    # nothing can pin it:
        return default, {}                                              # no signature to compute
    buffers = {b.name: b for b in loop.buffers}
    value, sigs = {}, {}
    for k in loop.kernels:
        t = k.writes[0] if k.writes else None
        if t not in choices:
            continue
        sigs[k.name] = signature(k, buffers)
        kctx, _ = ctx.for_kernel(sigs[k.name])
        if t not in value or kctx.pinned("STORE"):
            value[t] = min(kctx.knob("STORE", default[t]), len(choices[t].values))   # more: all
    return value, sigs
