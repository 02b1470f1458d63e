"""Fusion planning: which Tensor IR nodes get a buffer, and the parallel domain of each kernel.

Everything that is not materialized is inlined (recomputed) into its consumers, so a chain of
elementwise ops, index maps and reductions becomes one loop nest. Inlining stops where it would
multiply work (the blow-up guard):

* a reduction read at an index that depends on an enclosing reduction's loop variable would be
  recomputed for every iteration of that loop;
* a reduction that depends on fewer of the kernel's parallel axes than its siblings would be
  recomputed once per point of the missing axes;
* a reduction read at more than one index (RoPE's rotate_half reads q at d and d +- half) would
  be computed once per index at every point.

Such a reduction is materialized (its own kernel) and the refusal is logged with its reason at -v.
When the first kind is refused (on a CPU the second too, under a reduction), the planner first
tries to materialize the elementwise node the enclosing reduction reads instead (the Llama MLP's
silu(x @ wg) * (x @ wu), attention's softmax): if its kernel is one row kernel with the refused
reduction and its siblings as loops, the consumer then loads a plain tensor.
A materialized elementwise tensor whose first consumer kernel has the same shape is stored by
that kernel instead of getting its own (residual add + RMSNorm is one kernel).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from math import prod

from ..core.context import Context
from ..core.expr import Const, Expr, Op, Var, add, free_vars, substitute
from ..tensor.ir import (Custom, Elementwise, Full, Gather, IndexMap, Input, Iota, Reduce, Scatter,
                         TensorProgram, IDX)
from .attention import AttentionPlan, computed_operands, reached_buffers, reductions_to_materialize
from .attention_match import find_attention
from .custom import CustomPlan
from .store import recomputed, store_choices


@dataclass
class KernelPlan:
    target: str                         # the materialized node this kernel computes
    outer: tuple[int, ...]              # output dims that are parallel "outer" loops
    merged: tuple[str, ...] = ()        # other materialized nodes this kernel also stores
    reduces: tuple[str, ...] = ()
    # elementwise values computed inline, how many times each point of them is computed and
    # whether inside a reduction (store.recomputed)
    inline: tuple[tuple[str, int, bool], ...] = ()


@dataclass
class FusionPlan:
    materialized: list[str]             # topological order
    kernels: list[KernelPlan] = field(default_factory=list)
    # the STORE knob's choices per kernel target (store.py)
    choices: dict = field(default_factory=dict)


class _Refusal(Exception):
    def __init__(self, node: str, reason: str, path: tuple[str, ...] = (), broadcast=False):
        self.node, self.reason, self.broadcast = node, reason, broadcast
        self.path = path        # a reduction inside another: the nodes walked since that one


def _index_through(node, index: tuple[Expr, ...]) -> tuple[Expr, ...]:
    mapping = {f"i{d}": e for d, e in enumerate(index)}
    return tuple(substitute(e, mapping) for e in node.index)


def _a_range(valid) -> bool:
    """Whether an IndexMap's `valid` bounds each index by constants only (a piece of a cat, a
    pad): its point set is a box, often a thin one, unlike a causal mask's triangle (i3 <= i2),
    which a fused attention's key loop stops at instead."""
    if valid is None:
        return False
    if isinstance(valid, Op) and valid.op == "logical_and":
        return all(_a_range(a) for a in valid.args)
    return isinstance(valid, Op) and len(free_vars(valid)) == 1


class _Walker:
    """Dry run of inlining from one materialized target: which reductions, at which indices."""

    def __init__(self, prog: TensorProgram, materialized: set[str], inline: set[str]):
        self.prog, self.by_name = prog, prog.by_name
        self.materialized, self.inline = materialized, inline
        self.reduce_deps: dict[str, set[str]] = {}
        self.reduce_at: dict[str, set[tuple]] = {}      # the indices each reduction is read at
        self.reached: set[str] = set()          # materialized nodes read (loaded)
        self.seen: set = set()
        self.counter = 0
        self.path: list[str] = []               # the nodes being walked, outermost first
        self.inside: dict[str, tuple] = {}      # reductions read inside another: the path between
        self.partial = 0                        # IndexMaps with a `valid` being walked through
        self.elementwise: dict[str, set] = {}   # inline elementwise values: the indices each
                                                # is read at, and whether inside a reduction

    def walk(self, name: str, index: tuple[Expr, ...], reduce_vars: frozenset[str]) -> None:
        # only the enclosing reduction variables the index mentions can change what is below
        # (a reduction read at a fixed index inside k nested rounds of topk is walked once)
        key = (name, index, reduce_vars & set().union(*map(free_vars, index)))
        if key in self.seen:
            return
        self.seen.add(key)
        n = self.by_name[name]
        if (name in self.materialized and name not in self.inline) or isinstance(n, Input):
            self.reached.add(name)
            return
        if isinstance(n, (Full, Iota)):
            return
        self.path.append(name)
        self._walk(n, index, reduce_vars)
        self.path.pop()

    def _walk(self, n, index: tuple[Expr, ...], reduce_vars: frozenset[str]) -> None:
        name = n.name
        if isinstance(n, Elementwise):
            if name not in self.inline:
                self.elementwise.setdefault(name, set()).add((index, bool(reduce_vars)))
            for a in n.operands():
                self.walk(a, index, reduce_vars)
        elif isinstance(n, IndexMap):
            piece = _a_range(n.valid)               # a piece of a cat or a pad
            self.partial += piece
            self.walk(n.arg, _index_through(n, index), reduce_vars)
            self.partial -= piece
        elif isinstance(n, Gather):
            self.walk(n.indices, index, reduce_vars)
            # the gathered position depends on every variable the index value depends on
            idx: Expr = Const(0)
            for v in sorted(set().union(*map(free_vars, index))) if index else ():
                idx = add(idx, Var(v))
            sub = tuple(substitute(e, {**{f"i{d}": x for d, x in enumerate(index)}, IDX.name: idx})
                        for e in n.index)
            self.walk(n.data, sub, reduce_vars)
        elif isinstance(n, Reduce):
            if self.partial:
                raise _Refusal(name, f"refused fusing {name} ({n.op}) into its consumer: it fills "
                                     f"only part of it (a piece of a concatenation or a pad) but "
                                     f"would be computed at every point")
            deps = set().union(*map(free_vars, index)) if index else set()
            inner = deps & reduce_vars
            if reduce_vars:     # read inside another reduction: the nodes walked since that one
                below = next(k for k in range(len(self.path) - 2, -1, -1)
                             if isinstance(self.by_name[self.path[k]], Reduce))
                between = tuple(self.path[below + 1:-1])
                if inner:
                    raise _Refusal(name, f"refused fusing {name} ({n.op}) into its consumer: it would "
                                         f"be recomputed for every iteration of an enclosing reduction",
                                   between)
                self.inside.setdefault(name, between)
            self.reduce_deps.setdefault(name, set()).update(deps)
            self.reduce_at.setdefault(name, set()).add(index)
            self.counter += 1
            r = f"r{self.counter}"
            src = self.by_name[n.arg]
            sub = tuple((Const(0) if src.type.shape[d] == 1 else Var(r)) if d in n.axes else index[d]
                        for d in range(len(src.type.shape)))     # (an axis of one: no loop to
                                                                  # recompute anything in)
            self.walk(n.arg, sub, reduce_vars | {r})
        else:
            raise TypeError(f"unknown Tensor IR node {n!r}")


def plan_scatter(prog: TensorProgram, target: str, materialized: set[str]
                 ) -> tuple[KernelPlan, set[str]]:
    """A Scatter's kernel runs over the rows it writes (values' shape), computing the values and
    positions inline; a reduction among them gets its own kernel (loop/scatter.py)."""
    n = prog.node(target)
    shape = prog.node(n.values).type.shape
    index = tuple(Var(f"o{d}") if s > 1 else Const(0) for d, s in enumerate(shape))
    w = _Walker(prog, materialized, set())
    w.walk(n.values, index, frozenset())
    w.walk(n.indices, (index[n.axis],), frozenset())
    w.reached.add(n.dest)
    if w.reduce_deps:
        r = next(iter(w.reduce_deps))
        raise _Refusal(r, f"refused fusing {r} into the scatter {target}: a scatter kernel "
                          f"computes only elementwise values inline")
    return KernelPlan(target, tuple(d for d, s in enumerate(shape) if s > 1)), w.reached


BLOCK_SCALAR_MAX = 1 << 16     # elements a GPU block sums before its contraction (decode's norm)


def plan_kernel(prog: TensorProgram, target: str, materialized: set[str],
                merged: tuple[str, ...] = (), block_scalars: bool = False) -> tuple[KernelPlan, set[str]]:
    """The parallel domain of the kernel computing `target`; raises _Refusal on blow-up.
    block_scalars (GPUs): a reduction to one value of at most BLOCK_SCALAR_MAX elements, read by a
    kernel that also holds a contraction over all its parallel axes (a decode step's RMSNorm sum
    before its projection), is computed by every block of that kernel, its threads together
    (tile/passes/block_prelude_reduce.py), rather than by a one-block kernel of its own."""
    node = prog.node(target)
    if isinstance(node, Scatter):
        return plan_scatter(prog, target, materialized)
    shape = node.type.shape
    index = tuple(Var(f"o{d}") if s > 1 else Const(0) for d, s in enumerate(shape))
    w = _Walker(prog, materialized, {target, *merged})
    w.walk(target, index, frozenset())
    for m in merged:
        w.walk(m, index, frozenset())
    dims = {f"o{d}": d for d, s in enumerate(shape) if s > 1}
    if not w.reduce_deps:
        outer = tuple(dims.values())
        return KernelPlan(target, outer, merged, inline=recomputed(w.elementwise, shape, outer)), w.reached
    for r, at in w.reduce_at.items():
        if len(at) > 1:
            raise _Refusal(r, f"refused fusing {r} into {target}: it is read at {len(at)} indices "
                              f"and would be computed {len(at)}x at every point")
    outer_vars = set().union(*w.reduce_deps.values())
    worst = None
    contraction = any(deps and deps == outer_vars and r not in w.inside
                      for r, deps in w.reduce_deps.items())
    for r, deps in w.reduce_deps.items():
        if block_scalars and not deps and contraction \
                and prod(prog.node(prog.node(r).arg).type.shape) <= BLOCK_SCALAR_MAX:
            continue
        factor = prod(shape[dims[v]] for v in outer_vars - deps)
        if factor > 1 and (worst is None or factor > worst[1]):
            worst = (r, factor)
    if worst is not None:
        r, factor = worst
        raise _Refusal(r, f"refused fusing {r} into {target}: it would be recomputed {factor}x "
                          f"(it depends on fewer parallel axes than the kernel)", w.inside.get(r, ()),
                       broadcast=True)
    outer = tuple(sorted(dims[v] for v in outer_vars))
    return KernelPlan(target, outer, merged, tuple(w.reduce_deps),
                      recomputed(w.elementwise, shape, outer)), w.reached


def _only_through(prog, r: str, x: str, materialized: set[str]) -> bool:
    """Whether every use of r's value goes through x's kernel, so that materializing x leaves
    nothing else to recompute r (a residual add's other reader must not inline o_proj again)."""
    cone, stack = set(), [x]
    while stack:
        name = stack.pop()
        if name not in cone:
            cone.add(name)
            stack.extend(o for o in prog.node(name).operands() if o not in materialized)
    stack, seen = [r], {x}
    while stack:
        for u in prog.users.get(stack.pop(), ()):
            if u not in seen:
                if u not in cone or u in materialized or u in prog.outputs:
                    return False
                seen.add(u)
                stack.append(u)
    return r not in prog.outputs


def _row_instead(prog, r: _Refusal, materialized: set[str]) -> tuple[str, str] | None:
    """For a reduction refused inside an enclosing one: the node nearest that enclosing reduction,
    on the path down to the refused one, to materialize instead: elementwise, its own kernel one
    row kernel whose loops are this reduction and its siblings, and no larger than the
    reduction's result (nothing broadcast). When the reduction was refused for missing axes of
    the consumer (CPUs only: the row max and sum of attention's `softmax @ v`, a LayerNorm's mean
    and variance: two or more row reductions), no larger than a tensor its kernel reads."""
    size = prod(prog.node(r.node).type.shape)
    for x in r.path:
        n = prog.node(x)
        if not isinstance(n, Elementwise) or prod(n.type.shape) > size and not r.broadcast \
                or not _only_through(prog, r.node, x, materialized):
            continue
        trial = materialized | {x}
        while True:     # what planning x will materialize anyway (an RMSNorm's row sum) is no obstacle
            try:
                kp, reads = plan_kernel(prog, x, trial)
                break
            except _Refusal as again:
                if again.node == r.node:
                    kp = None
                    break
                trial.add(again.node)
        if kp is None or r.node not in kp.reduces or r.broadcast and len(kp.reduces) < 2 \
                or prod(n.type.shape) > max([size] + [prod(prog.node(b).type.shape) for b in reads]):
            continue
        return x, (f"fuse: materialized {x} instead of {r.node}: one kernel with reduction loops "
                   f"{', '.join(kp.reduces)} over the same axes, read by the enclosing reduction")
    return None


def _has_reduce(prog: TensorProgram, name: str, materialized: set[str]) -> bool:
    by_name, stack, seen = prog.by_name, [name], set()
    while stack:
        n = by_name[stack.pop()]
        if n.name in seen:
            continue
        seen.add(n.name)
        if isinstance(n, Reduce):
            return True
        stack.extend(o for o in n.operands() if o not in materialized or o == name)
    return False


STORED_OPERAND_QUERIES = 64  # fewer (a decode step): Q, K, V computed inside the attention
CPU_FLASH_QUERIES = 64      # fewer queries (decode, a short draft): the matmul and softmax
                            # kernels, whose split over the keys (cpu_split_groups) fills the cores


def _cpu_flash(m, ctx: Context) -> bool:
    """Whether a CPU runs attention `m` as one flash kernel (FLASH pins it): softmax forms of
    CPU_FLASH_QUERIES queries or more; else its matmul and softmax kernels (a backward's sum
    form always)."""
    if m.norm != "softmax" or m.qk2 is not None:
        return False
    flash = ctx.knob("FLASH", m.lq >= CPU_FLASH_QUERIES)
    ctx.log(f"fuse: attention at {m.out}: {'one flash kernel' if flash else 'its matmul and softmax kernels'}"
            f" ({'FLASH pinned' if ctx.pinned('FLASH') else f'{m.lq} queries'})", 2)
    return flash


class _Indexed:
    """A TensorProgram whose name -> node table is built once (TensorProgram.by_name rebuilds it
    on every call; planning a whole model looks nodes up millions of times)."""

    def __init__(self, prog: TensorProgram):
        self.nodes, self.outputs, self.by_name = prog.nodes, prog.outputs, prog.by_name
        self.mutations = getattr(prog, "mutations", {})
        self.users: dict[str, list[str]] = {}
        for n in prog.nodes:
            for o in dict.fromkeys(n.operands()):
                self.users.setdefault(o, []).append(n.name)

    def node(self, name: str):
        return self.by_name[name]


def plan(prog: TensorProgram, ctx: Context | None = None, stored: frozenset = frozenset()
         ) -> FusionPlan:
    """`stored`: inline values the STORE knob has a kernel of their own compute."""
    ctx = ctx or Context()
    prog = _Indexed(prog)
    planned = partial(plan_kernel, block_scalars=ctx.arch.is_gpu)
    pos = {n.name: k for k, n in enumerate(prog.nodes)}
    materialized = {o for o in prog.outputs if not isinstance(prog.node(o), Input)} | stored
    # softmax(q @ k^T ...) @ v: one flash-attention kernel each (loop/attention.py), planned apart
    attn = find_attention(prog, materialized, ctx.log)
    if not ctx.arch.is_gpu:
        attn = {out: m for out, m in attn.items() if _cpu_flash(m, ctx)}
    lse_of = {m.lse: m.out for m in attn.values() if m.lse}     # written by the attention kernel
    for m in attn.values():
        materialized.add(m.out)
        materialized |= reductions_to_materialize(prog, m, materialized)
        if m.lq >= STORED_OPERAND_QUERIES:      # a prompt: its blocks of queries refill K and V
            materialized |= computed_operands(prog, m, materialized)
    materialized |= set(lse_of)
    materialized |= {v for v in prog.mutations.values() if not isinstance(prog.node(v), Input)}
    custom = {n.name: n for n in prog.nodes if isinstance(n, Custom)}
    for n in custom.values():     # a hand-written kernel reads buffers and writes one
        materialized.add(n.name)
        materialized |= {a for a in n.operands() if not isinstance(prog.node(a), Input)}
    for n in prog.nodes:          # a scatter and its destination are buffers (loop/scatter.py)
        if isinstance(n, Scatter):
            materialized.add(n.name)
            if not isinstance(prog.node(n.dest), Input):
                materialized.add(n.dest)
    # Plan the earliest target not yet planned; a refusal materializes one more node (an earlier
    # one) and planning goes on from there. Materializing only prunes what a kernel inlines, so
    # a kernel that passed keeps passing: no target is planned twice before the final pass below,
    # and the refusals come in the order a restart from the first target would find them.
    passed: set[str] = set(attn) | set(custom) | set(lse_of)
    while len(passed) < len(materialized):
        t = min(materialized - passed, key=pos.__getitem__)
        try:
            planned(prog, t, materialized)
            passed.add(t)
        except _Refusal as r:
            ctx.log(f"fuse: {r.reason}")
            gpu_broadcast = r.broadcast and ctx.arch.is_gpu     # a GPU fuses it into its matmul
            instead = _row_instead(prog, r, materialized) if r.path and not gpu_broadcast else None
            if instead:
                ctx.log(instead[1])
            materialized.add(instead[0] if instead else r.node)
    mats = sorted(materialized, key=pos.__getitem__)
    reached = {t: reached_buffers(prog, attn[t], materialized) if t in attn
               else set() if t in lse_of
               else set(custom[t].operands()) if t in custom
               else planned(prog, t, materialized)[1] for t in mats}

    # Merge an elementwise-only materialized tensor into its first consumer kernel of equal shape.
    merged_into: dict[str, str] = {}
    for x in mats:
        if _has_reduce(prog, x, materialized) or isinstance(prog.node(x), (Scatter, Custom)) \
                or x in lse_of:
            continue
        loaders = [t for t in mats if x in reached[t]]
        if loaders and not isinstance(prog.node(loaders[0]), Scatter) \
                and prog.node(loaders[0]).type.shape == prog.node(x).type.shape \
                and loaders[0] not in merged_into and loaders[0] not in attn \
                and loaders[0] not in custom:
            merged_into[x] = loaders[0]
    for x, t in merged_into.items():     # into a tensor merged on itself: into that one's kernel
        while t in merged_into:          # (a layer norm's mean into its rstd into its output)
            t = merged_into[t]
        merged_into[x] = t
    kernels = []
    for t in mats:
        if t in merged_into or t in lse_of:
            continue
        if t in attn:
            kernels.append(AttentionPlan(t, attn[t]))
            continue
        if t in custom:
            kernels.append(CustomPlan(t))
            continue
        extra = tuple(x for x in mats if merged_into.get(x) == t)
        try:
            kp, _ = planned(prog, t, materialized, extra)
        except _Refusal:
            for x in extra:
                merged_into.pop(x)
            kp, _ = planned(prog, t, materialized)
            kernels.extend(planned(prog, x, materialized)[0] for x in extra)
        if extra:
            ctx.log(f"fuse: {', '.join(extra)} stored by the kernel of {t} (same domain)")
        kernels.append(kp)
    kernels.sort(key=lambda k: pos[k.target])
    return FusionPlan(mats, kernels, store_choices(prog, kernels, pos, materialized))
