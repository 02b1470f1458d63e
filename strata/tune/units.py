"""A tuning candidate compiled alone: the loop kernels of one signature as a program of their own
(a unit), run on the operands a whole run of the default schedule gave them.

Why: a candidate changes the kernels of one signature only, yet compiling and checking a whole
model for it took a minute (TinyLlama's prefill: 312 loop kernels, 6 s of lowering, 2.6 MB of C).
A unit is those kernels (one per layer, say) from Loop IR on: a C file of their own, loaded with
the program's weights, run on the operands a run of the default stepped kernel by kernel gave
them (taken once per signature), checked against the same unit with the default schedule within
the output dtype's tolerance (bench/check.py) and timed against it. A unit's winner is checked
again in the whole program against eager before it is kept (search.py).
"""
from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from ..bench.check import as_numpy64, compare, tolerance
from ..core.context import Context
from ..loop.ir import LoopProgram
from ..pipeline import Lowered, packing_that_fits, schedule_loop_program
from ..runtime.native import NativeProgram


def carve(loop: LoopProgram, names: set[str]) -> LoopProgram | None:
    """The loop kernels `names` as a program: what they read that none of them wrote before is
    an input (weights stay weights), what they write an output. None when one of them writes
    what it or an earlier one read (an update in place: its operand would be gone)."""
    kernels = [k for k in loop.kernels if k.name in names]
    read, written = set(), set()
    for k in kernels:
        if set(k.writes) & (read | set(k.reads)):
            return None
        read |= {r for r in k.reads if r not in written}
        written |= set(k.writes)
    kinds = {b.name: b.kind for b in loop.buffers}
    buffers = [replace(b, kind="weight" if b.kind == "weight" else
                       "output" if b.name in written else "input")
               for b in loop.buffers if b.name in read | written]
    return LoopProgram(buffers, kernels, [b.name for b in buffers if b.kind == "output"],
                       {n: loop.weights[n] for n in loop.weights if n in read and kinds[n] == "weight"})


def operands(program, unit: LoopProgram, inputs) -> dict[str, Tensor]:
    """What the unit reads, by name in its input order: run the whole `program` (api.Program,
    CPU) kernel by kernel on `inputs`, taking a copy of each before its first reader runs."""
    run = program.runtime.kernel_runner(inputs, whole_run=False)
    lowered = program.lowered
    loops = {k.name: k for k in unit.kernels}
    launches = [(i, lowered.tile.origin.get(k.name, k.name))
                for i, k in enumerate(lowered.kernel.kernels) if i not in run.once]
    order = [b.name for b in unit.buffers if b.kind == "input"]
    taken = {}
    for i, name in launches:
        for r in loops[name].reads if name in loops else ():
            if r in order and r not in taken:
                taken[r] = run.view(r).clone()
        if len(taken) == len(order):
            break
        run(i)
    return {n: taken[n] for n in order}


def lower_unit(unit: LoopProgram, ctx: Context, whole: LoopProgram, source: bool = True) -> Lowered:
    """The unit scheduled as the whole program would schedule its kernels: packing weights or
    not is decided by all of the program's weights (pipeline.packing_that_fits), not the unit's.
    To its C, or to Kernel IR (what the cost model reads) unless `source`."""
    ctx = packing_that_fits(whole, ctx)
    return schedule_loop_program(Lowered(None, loop=unit, target=ctx.arch), ctx,
                                 ctx.arch.language if source else "kernel")


def load_unit(lowered: Lowered, weights: dict) -> NativeProgram:
    program = lowered.kernel
    names = {b.name for b in program.buffers if b.kind == "weight"}
    return NativeProgram(program, {n: w for n, w in weights.items() if n in names},
                         source=lowered.source)


def check_unit(native: NativeProgram, default: NativeProgram, ops: dict) -> str | None:
    """None when the unit's outputs match its default schedule's on the same operands within
    their dtype's tolerance, else the first that does not. Both poisoned first: an element one
    leaves unwritten that the other writes shows (a unit may write part of a buffer, a split
    kernel's other part being another signature's)."""
    outs = []
    for program in (native, default):
        program.poison = True
        try:
            outs.append(program.run(list(ops.values())))
        finally:
            program.poison = False
    for name, got, want in zip(native.program.outputs, *outs):
        dt = next(b.dtype for b in native.program.buffers if b.name == name)
        out = compare(name, dt, as_numpy64(got), as_numpy64(want), tolerance(dt, True))
        if not out.passed:
            return f"{name}: rel err {out.rel:.3g} against the default schedule's (tolerance {out.tol})"
    return None


def unit_calls(native: NativeProgram, ops: dict):
    """A function running the unit's kernels (not those run at load), on buffers a whole run of
    it filled."""
    run = native.kernel_runner(list(ops.values()))
    picks = [i for i in range(len(native.program.kernels)) if i not in run.once]

    def calls():
        for i in picks:
            run(i)
    return calls
