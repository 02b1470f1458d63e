"""`strata compile MODEL`: build a Hugging Face model (or one decoder layer), capture it, lower
it and print one stage.

Building and capturing a whole model takes seconds, so a spinner on stderr says which step is
running (only on a terminal; at -v the timing lines say it instead). A summary goes to stderr
after the stage text: what was compiled, where the weights come from (none are needed to
compile: the model is built on the meta device), and how many kernels came out.
"""
from __future__ import annotations

import re
import sys
import time
from collections import Counter
from contextlib import nullcontext

from ..core.context import Context
from ..core.errors import StrataError

# What runs after each stage the pipeline logs (its timing line starts with the stage's name).
NEXT_STEP = {
    "decompose -> tensor": "fusing into loop nests",
    "fuse -> loop": "scheduling (tile passes)",
    "schedule -> tile": "lowering to Kernel IR",
    "lower -> kernel": "emitting CUDA",
}


class ProgressContext(Context):
    """A Context that also moves a spinner along as the pipeline logs each finished stage."""

    def __init__(self, *args, on_step=None, **kw):
        super().__init__(*args, **kw)
        self.on_step = on_step

    def log(self, msg: str, level: int = 1) -> None:
        super().log(msg, level)
        if self.on_step is not None:
            for stage, step in NEXT_STEP.items():
                if msg.startswith(stage):
                    self.on_step(step)


def compile_model_command(args, base: Context) -> int:
    from rich.console import Console

    from ..api import compile_model
    summary = args.ir is None and not args.output     # a whole model's CUDA: 100,000s of lines
    console = Console(stderr=True, highlight=False)
    spinner = console.status("starting") if base.verbosity == 0 else nullcontext()
    t0 = time.perf_counter()
    with spinner as status:
        step = status.update if status is not None else (lambda text: None)
        ctx = ProgressContext(verbosity=base.verbosity, knobs=base.knobs, target=base.target,
                              tuned=base.tuned, stream=base.stream, on_step=step)
        program, built = compile_model(args.model, layer=args.layer, seq_len=args.seq_len,
                                       dtype=args.dtype, ctx=ctx, until=args.ir or "cuda",
                                       progress=step, quant=args.quant)
        args.ir = args.ir or program.lowered.target.language
        text = program_summary(program) if summary else program.ir(args.ir)
    seconds = time.perf_counter() - t0
    ctx.log(f"{'total':<28} {seconds * 1e3:8.2f} ms")
    if summary:
        print(text)
    else:
        write_stage(text, args)
    sys.stdout.flush()
    kernels = program.lowered.kernel.kernels if program.lowered.kernel is not None else None
    made = f"{len(kernels)} kernels" if kernels is not None else f"{args.ir} IR"
    print(f"strata: {built.what}, seq {args.seq_len}: {len(program.torch_program.nodes)} aten ops "
          f"-> {made} in {seconds:.1f} s", file=sys.stderr)
    print(f"strata: weights: {built.weights}", file=sys.stderr)
    return 0


def program_summary(program) -> str:
    """What `strata compile MODEL` prints without --ir: the kernels counted by kind (a layer's
    kernels differ only by the number in their names), then how to print each stage."""
    low = program.lowered
    kinds = Counter(re.sub(r"_\d+(?=_|$)", "", k.name) for k in low.kernel.kernels)
    source = low.target.language
    return "\n".join([f"{len(low.kernel.kernels)} kernels for {low.target}, of {len(kinds)} kinds:",
                      *(f"  {n:5d} x {kind}" for kind, n in kinds.most_common()),
                      f"print a stage with --ir: torch ({len(low.torch.nodes):,} aten ops), tensor, "
                      f"loop, tile, kernel or {source} ({len(low.text(source).splitlines()):,} "
                      f"lines); -o FILE writes it to a file"])


def write_stage(text: str, args) -> None:
    """The printed stage to `-o FILE` (saying so on stderr) or to stdout."""
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(text + "\n")
        except OSError as e:
            raise StrataError(f"cannot write {args.output}: {e.strerror}") from None
        print(f"wrote {args.ir} IR to {args.output}", file=sys.stderr)
    else:
        print(text)
