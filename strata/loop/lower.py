"""Tensor IR -> Loop IR: one loop nest per planned kernel (fuse.py's plan), built by inlining
producers (builder.py); a fused attention, a scatter and a hand-written kernel build their own.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.context import Context
from ..core.expr import Const, Expr, Var
from ..tensor.ir import Input, Scatter, TensorProgram
from . import scatter
from .builder import LoopBuilder
from .fuse import FusionPlan, KernelPlan, plan as plan_fusion
from .ir import BufferInfo, LoopKernel, LoopProgram, Store, canonical_names
from .store import store_decisions

def build_kernel(prog: TensorProgram, kp: KernelPlan, materialized: set[str], name: str) -> LoopKernel:
    target = prog.node(kp.target)
    shape = target.type.shape
    b = LoopBuilder(prog, materialized, {kp.target, *kp.merged})
    index: list[Expr] = [Const(0)] * len(shape)
    for d in kp.outer:
        # all outer loops count as one level, so nothing is hoisted between them
        index[d] = Var(b.open_loop(shape[d], "free"))
    outer_scope = b.stack[-1]
    for var in [e.name for e in index if isinstance(e, Var)]:
        b.home[var] = outer_scope
    for d, s in enumerate(shape):
        if s > 1 and d not in kp.outer:
            index[d] = Var(b.open_loop(s, "free"))
    idx = tuple(index)
    for t in (kp.target, *kp.merged):
        v = b.value(t, idx)
        b.stack[-1].stmts.append(Store(t, idx, v))
    while len(b.stack) > 1:
        b.close_loop()
    writes = (kp.target, *kp.merged)
    return canonical_names(LoopKernel(name, tuple(b.root.stmts), tuple(b.reads), writes,
                                      src=target.src), reserved=set(prog.by_name))


def kernel_name(kp: KernelPlan, taken: set[str]) -> str:
    base = f"k_{kp.target}" + ("_reduce" if kp.reduces else "")
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def lower(prog: TensorProgram, ctx: Context | None = None, plan: FusionPlan | None = None) -> LoopProgram:
    """The whole Tensor IR program as loop kernels, in execution order. STORE (store.py): the
    CPU's rule stores some values the plan inlines; a kernel whose STORE knob (pinned or tuned,
    by its signature as the rule builds it) asks otherwise is planned and built again."""
    ctx = ctx or Context()
    plan = plan or plan_fusion(prog, ctx)
    rule = frozenset() if ctx.arch.is_gpu else frozenset(
        x for c in plan.choices.values() for x in c.values[:c.by_rule])
    # planned again from the plan's own buffers, its refusals settled (planning is most of the
    # time: 2.5 s of TinyLlama's 3.5)
    again = lambda more: plan_fusion(prog, ctx, frozenset(plan.materialized) | more)  # noqa: E731
    loop = _lower(prog, ctx, again(rule) if rule else plan)
    decided, sigs = store_decisions(loop, plan.choices, ctx)
    stored = frozenset(x for t, n in decided.items() for x in plan.choices[t].values[:n])
    if stored != rule:
        ctx.log(f"fuse: STORE: {', '.join(sorted(stored)) or 'nothing'} stored by kernels of "
                f"their own (the rule: {', '.join(sorted(rule)) or 'nothing'})")
        loop = _lower(prog, ctx, again(stored))
    # (planned again, a kernel keeps its signature as the rule built it: its tuned knobs apply)
    loop.kernels = [replace(k, knobs=(("STORE", decided[k.writes[0]]),),
                            stores=plan.choices[k.writes[0]].values,
                            tuning_key=sigs.get(k.name, "") if stored != rule else "")
                    if k.writes and k.writes[0] in decided else k for k in loop.kernels]
    return loop


def _lower(prog: TensorProgram, ctx: Context, plan: FusionPlan) -> LoopProgram:
    materialized = set(plan.materialized)
    taken: set[str] = set()
    alias = scatter.aliases(prog)         # scatters stored in place (KV-cache writes)
    kernels = []
    planned = [kp for kp in plan.kernels if prog.node(kp.target).type.numel]   # empty: no launch
    while planned:
        kp = planned.pop(0)
        if hasattr(kp, "build"):          # a fused attention (loop/attention.py)
            kernels.append(kp.build(prog, materialized, kernel_name(kp, taken), alias))
        elif isinstance(prog.node(kp.target), Scatter):
            group = [kp]                  # the K and V caches' writes: one kernel
            while planned and not hasattr(planned[0], "build") and \
                    scatter.siblings(prog, group + planned[:1], materialized, alias):
                group.append(planned.pop(0))
            if len(group) > 1:
                ctx.log(f"loop: one kernel stores {', '.join(g.target for g in group)} (same "
                        f"positions)", 2)
            kernels += scatter.scatter_kernels(prog, group, materialized, kernel_name(kp, taken),
                                               alias)
        else:
            kernels.append(build_kernel(prog, kp, materialized, kernel_name(kp, taken)))
    before, copies = scatter.snapshots(prog, materialized)   # an input returned as it was
    kernels = copies + kernels
    if in_place := scatter.stored_in_place(prog, kernels, alias):    # no write-back copy
        ctx.log("loop: stored in the input it updates: " +
                ", ".join(f"{v} -> {i}" for v, i in in_place.items()), 2)
    alias = {**alias, **in_place}
    kernels = scatter.rename_buffers(kernels + scatter.write_back(prog, materialized, alias), alias)
    outputs = [before.get(o, alias.get(o, o)) for o in prog.outputs]  # (a scatter: its buffer's)
    buffers = []
    for n in prog.nodes:
        if isinstance(n, Input):
            buffers.append(BufferInfo(n.name, n.type.shape, n.type.dtype, n.kind))
            if n.name in before:
                buffers.append(BufferInfo(before[n.name], n.type.shape, n.type.dtype, "output"))
        elif n.name in materialized and n.name not in alias:
            kind = "output" if n.name in outputs else "temp"
            buffers.append(BufferInfo(n.name, n.type.shape, n.type.dtype, kind))
    return LoopProgram(buffers, kernels, outputs, prog.weights)   # read lazily
