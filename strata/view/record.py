"""A Context that keeps the whole -vv log (every pass's diff) while printing only what the user
asked for.

Why: the pass history on the page is rebuilt from the log the pipeline already writes at -vv
(strata/pipeline.py `run_tile_passes`), so the view needs no hook in the compiler; but a user of
`strata view` asked for a page, not for the diffs on stderr."""
from __future__ import annotations

import sys
from dataclasses import dataclass

from ..core.context import Context
from ..pipeline import lower_torch_program


@dataclass
class RecordingContext(Context):
    shown: int = 0              # the verbosity the user asked for: lines up to it reach stderr

    def log(self, msg: str, level: int = 1) -> None:
        self.messages.append(msg)
        if self.shown >= level:
            print(msg, file=self.stream or sys.stderr)


def recording(ctx: Context | None) -> RecordingContext:
    """A fresh recording copy of `ctx` (its knobs, target, tuned schedules and stream), at -vv,
    printing what `ctx` would have printed."""
    ctx = ctx or Context()
    return RecordingContext(verbosity=2, knobs=dict(ctx.knobs), target=ctx.target,
                            stream=ctx.stream, kernel_knobs=ctx.kernel_knobs, tuned=ctx.tuned,
                            shown=getattr(ctx, "shown", ctx.verbosity))


def recorded_lowering(program):
    """(Lowered, RecordingContext) of `program`: its own when it was compiled with a recording
    context (strata view), else its Torch IR lowered again with a recording copy of its context
    (the same knobs and target give the same kernels: tests/view checks that a viewed
    Program's stages are its own)."""
    ctx = getattr(program, "ctx", None)
    if isinstance(ctx, RecordingContext) and program.lowered.kernel is not None:
        return program.lowered, ctx
    rec = recording(ctx)
    rec.shown = 0
    if rec.target is None:
        rec.target = program.lowered.target
    until = rec.arch.language
    return lower_torch_program(program.lowered.torch, rec, until), rec
