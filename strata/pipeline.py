"""The whole lowering as one list of named stages and passes: read this file first.

    Torch IR  --decompose-->  Tensor IR  --fuse+lower-->  Loop IR  --TILE_PASSES-->  Tile IR
              --lower-->  Kernel IR  --emit-->  CUDA C

Each stage's IR is verified after it is built (and after every tile pass). At -v each pass
prints its time and what it declined; at -vv each tile pass prints a unified diff between
`>>> t:NNN_name` and `<<< t:NNN_name`.
"""
from __future__ import annotations

import difflib
import hashlib
import os
import sys
import time
from dataclasses import dataclass, field, replace
from math import prod

from .codegen import emit_units
from .core import dtypes
from .core.context import Context
from .core.cpu_load import available_bytes
from .core.errors import StrataError
from .core.knobs import KNOBS, show
from .core.targets import SOURCE, STAGES
from .kernel_ir.lower import lower as lower_kernels
from .kernel_ir.lower_cpu import lower_cpu_forms
from .kernel_ir.prefetch_weights import prefetch_weights
from .kernel_ir.thread_loops import to_thread_loops
from .kernel_ir.verify import verify_program
from .loop.ir import LoopKernel, signature
from .loop.lower import lower as lower_loops
from .runtime.disasm import disassemble
from .tile.attention import tile_attention
from .tile.ir import TileProgram, verify_kernels
from .tile.passes.block_prelude_reduce import block_prelude_reduce
from .tile.passes.blockify_launch import blockify_launch
from .tile.passes.chunk_matmul_k import chunk_matmul_k
from .tile.passes.chunk_reduce import chunk_reduce
from .tile.passes.cooperative_reduce import cooperative_reduce
from .tile.passes.cpu_block_loops import cpu_block_loops
from .tile.passes.cpu_int8_rows import cpu_int8_rows
from .tile.passes.cpu_keep_values import cpu_keep_values
from .tile.passes.cpu_attention import cpu_attention
from .tile.passes.cpu_matmul import cpu_matmul
from .tile.passes.cpu_pack_weights import cpu_pack_weights
from .tile.passes.cpu_prologue import cpu_prologue
from .tile.passes.cpu_reciprocal import cpu_reciprocal
from .tile.passes.cpu_rows import cpu_rows
from .tile.passes.cpu_split_groups import cpu_split_groups
from .tile.passes.cpu_split_guards import cpu_split_guards
from .tile.passes.mark_unroll import mark_unroll
from .tile.passes.materialize_prologue import materialize_prologue
from .tile.passes.mma_async_copy import mma_async_copy
from .tile.passes.mma_pipeline import mma_pipeline
from .tile.passes.mma_swizzle import mma_swizzle
from .tile.passes.mma_tile import mma_tile
from .tile.passes.pad_smem import pad_smem
from .tile.passes.register_tile import register_tile
from .tile.passes.split_matmul_k import split_matmul_k
from .tile.passes.stage_inputs import stage_inputs
from .tile.passes.stage_matmul_tiles import stage_matmul_tiles
from .tile.passes.tile_matmul import tile_matmul
from .tile.passes.tileify import tileify
from .tile.passes.vectorize import vectorize
from .tile.passes.wgmma_pipeline import wgmma_pipeline
from .tile.passes.wgmma_tile import wgmma_tile

# The GPU schedule, in order. Numbers in -vv output are positions in this list (001 first).
GPU_PASSES = [
    ("tile_attention", tile_attention),
    ("tileify", tileify),
    ("split_matmul_k", split_matmul_k),
    ("materialize_prologue", materialize_prologue),
    ("wgmma_tile", wgmma_tile),
    ("wgmma_pipeline", wgmma_pipeline),
    ("mma_tile", mma_tile),
    ("mma_swizzle", mma_swizzle),
    ("mma_async_copy", mma_async_copy),
    ("mma_pipeline", mma_pipeline),
    ("tile_matmul", tile_matmul),
    ("register_tile", register_tile),
    ("chunk_matmul_k", chunk_matmul_k),
    ("stage_matmul_tiles", stage_matmul_tiles),
    ("pad_smem", pad_smem),
    ("chunk_reduce", chunk_reduce),
    ("cooperative_reduce", cooperative_reduce),
    ("vectorize", vectorize),
    ("blockify_launch", blockify_launch),
    ("stage_inputs", stage_inputs),
    ("mark_unroll", mark_unroll),
    ("block_prelude_reduce", block_prelude_reduce),
]
# Each kind of target names its schedule; the passes before tileify take Loop IR kernels (and
# the buffers they touch), the rest Tile IR kernels.
# The CPU schedule: contractions as packed register-tiled micro-kernels, rows across cores,
# inner loops vectorised by the C compiler (codegen/c.py).
CPU_PASSES = [
    ("cpu_attention", cpu_attention),
    ("tileify", tileify),
    ("cpu_split_groups", cpu_split_groups),
    ("chunk_reduce", chunk_reduce),
    ("cpu_int8_rows", cpu_int8_rows),
    ("cpu_prologue", cpu_prologue),
    ("cpu_matmul", cpu_matmul),
    ("cpu_pack_weights", cpu_pack_weights),
    ("cpu_rows", cpu_rows),
    ("cpu_block_loops", cpu_block_loops),
    ("cpu_keep_values", cpu_keep_values),
    ("cpu_reciprocal", cpu_reciprocal),
    ("cpu_split_guards", cpu_split_guards),
    ("mark_unroll", mark_unroll),
]
PIPELINES = {"gpu": GPU_PASSES, "cpu": CPU_PASSES}
TILE_PASSES = GPU_PASSES


def schedule_passes(target) -> list:
    """The pass list that schedules Loop IR for `target` (a targets.Target)."""
    if target.kind not in PIPELINES:
        raise StrataError(f"no schedule exists for {target.kind} targets such as {target} yet")
    return PIPELINES[target.kind]


@dataclass
class Lowered:
    """Every stage of one program; `text(stage)` is what `--ir stage` prints."""
    torch: object
    tensor: object = None
    loop: object = None
    tile: object = None
    kernel: object = None
    units: object = None           # codegen.Units: the source as its compiler takes it
    timings: dict = field(default_factory=dict)
    target: object = None          # the targets.Target it was scheduled for

    @property
    def source(self) -> str:
        """The source in the target's language: what `--ir <language>` prints and what the
        runtime compiles (CUDA: unit by unit), emitted once."""
        return self.units.text() if self.units is not None else ""

    def text(self, stage: str) -> str:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
        if stage in SOURCE.values() and self.target is not None and self.target.language != stage:
            raise StrataError(f"this program was compiled for {self.target}, whose source is "
                              f"--ir {self.target.language}, not {stage}")
        if stage == "asm":                    # the C built for the target's -march, disassembled
            if self.target is None or self.target.is_gpu:
                raise StrataError("--ir asm disassembles the C of a CPU target (--target host, "
                                  "cpu-spr, cpu-rvv ...); for a GPU print --ir cuda")
            return disassemble(self.source, self.target)
        if stage in SOURCE.values():
            return self.source
        value = getattr(self, stage)
        return value if isinstance(value, str) else str(value)


def _timed(ctx: Context, name: str, fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    dt = (time.perf_counter() - t0) * 1e3
    ctx.log(f"{name:<28} {dt:8.2f} ms")
    return out, dt


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def run_tile_passes(loop_program, ctx: Context):
    ctx = packing_that_fits(loop_program, ctx)
    buffers = {b.name: b for b in loop_program.buffers}
    passes = schedule_passes(ctx.arch)
    diffs = ctx.verbosity >= 2          # printing every stage costs time on a whole model
    before = str(loop_program) if diffs else ""
    kernels = list(loop_program.kernels)
    origin = {k.name: k.name for k in kernels}     # tile kernel -> the loop kernel it came from
    contexts = _kernel_contexts(kernels, buffers, ctx)
    unchanged = 0
    for num, (name, fn) in enumerate(passes, start=1):
        tag = f"t:{num:03d}_{name}"
        t0 = time.perf_counter()
        outs = []
        for k in kernels:
            kctx = contexts.get(origin[k.name], ctx)
            if getattr(k, "mode", None) == "custom":      # st.custom_op: scheduled by its author
                outs.append(k)
                continue
            if isinstance(k, LoopKernel):   # not yet scheduled: the pass also sees its buffers
                got = fn(k, kctx, tuple(buffers[b] for b in dict.fromkeys(k.reads + k.writes)))
            else:     # one kernel, or several when a pass splits one (chunk_reduce, split_matmul_k)
                got = fn(k, kctx)
            for out in _as_tuple(got):
                origin[out.name] = origin[k.name]
                outs.append(out)
        kernels = outs
        verify_kernels(kernels, ctx.arch)
        ctx.log(f"{tag:<28} {(time.perf_counter() - t0) * 1e3:8.2f} ms")
        if not diffs:
            continue
        after = str(TileProgram(kernels, loop_program))
        if after != before:
            diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=2)
            ctx.log("\n".join([f">>> {tag}", *list(diff)[2:], f"<<< {tag}"]), 2)
        unchanged += after == before
        before = after
    if diffs:
        ctx.log(f"{unchanged} of {len(passes)} tile passes changed nothing", 2)
    _log_unused_knobs(kernels, origin, ctx)
    return TileProgram(kernels, loop_program, origin)


def packing_that_fits(loop_program, ctx: Context) -> Context:
    """PACK=call on a CPU when a packed copy of every weight could not take under half the free
    memory: the native runtime would then pack them on every call (runtime/native.py), and the
    bf16 forms are better off in the dot form, which reads a weight as it lies."""
    if ctx.arch.is_gpu or ctx.pinned("PACK"):
        return ctx
    size = sum(prod(b.shape) * dtypes.ITEMSIZE[b.dtype] for b in loop_program.buffers
               if b.kind == "weight")
    free = available_bytes()
    if free is None or size <= free // 2:
        return ctx
    ctx.log(f"PACK=call: the weights ({size / 2**30:.1f} GiB) packed once would not fit in half "
            f"the free memory ({free / 2**30:.1f} GiB)")
    return replace(ctx, knobs={**ctx.knobs, "PACK": "call"})


def _kernel_contexts(kernels, buffers: dict, ctx: Context) -> dict[str, Context]:
    """{loop kernel: its context} for the kernels that have knobs of their own (a tuning
    candidate, or a tuned schedule from the database), logged at -v."""
    if not ctx.kernel_knobs and not ctx.tuned:
        return {}
    out = {}
    for k in kernels:
        kctx, source = ctx.for_kernel(signature(k, buffers))
        if source:
            out[k.name] = kctx
            pins = ", ".join(f"{n}={show(v)}" for n, v in kctx.knobs.items() if n not in ctx.knobs)
            ctx.log(f"{k.name}: {source} schedule {pins}" +
                    (" (from the tuning database; --no-tuned ignores it)" if source == "tuned" else ""))
    return out


def _log_unused_knobs(kernels, origin: dict, ctx: Context) -> None:
    """At -v, each pinned knob that no kernel made from a loop kernel uses (none prints it in its
    header), so a pin that cannot apply never passes silently. A pass that overrides a pin it
    cannot take (BLOCK under a pinned GROUP) says so itself."""
    used: dict[str, set] = {}
    for k in kernels:
        used.setdefault(origin[k.name], set()).update(n for n, _ in k.knobs)
    for name, seen in used.items():
        for knob, value in ctx.knobs.items():
            if knob not in seen:
                ctx.log(f"{name}: {knob}={show(value)} does not apply: its schedule has no such "
                        f"choice ({knob} is for {KNOBS[knob].scope})")


def lower_torch_program(torch_program, ctx: Context | None = None, until: str = "cuda") -> Lowered:
    """Lower a captured Torch IR program through every stage up to `until`."""
    from .tensor.decompose import to_tensor_ir
    from .tensor.merge_projections import merge_projections

    ctx = ctx or Context()
    torch_program = merge_projections(torch_program)
    # the passes recurse along dependence chains: topk(k=256) is a chain of 512 reductions
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
    for note in getattr(torch_program, "notes", ()):
        ctx.log(f"capture: {note}")
    out = Lowered(torch_program, target=ctx.arch)
    stop = STAGES.index(until)
    if stop < 1:
        return out
    out.tensor, out.timings["tensor"] = _timed(ctx, "decompose -> tensor", to_tensor_ir, torch_program)
    out.tensor.verify()
    if stop < 2:
        return out
    out.loop, out.timings["loop"] = _timed(ctx, "fuse -> loop", lower_loops, out.tensor, ctx)
    out.loop.verify()
    return schedule_loop_program(out, ctx, until)


def schedule_loop_program(out: Lowered, ctx: Context, until: str = "cuda") -> Lowered:
    """The stages after Loop IR, for `out.loop`: a whole program's, or the few kernels a tuning
    candidate changes (tune/units.py), which need not pass through the stages before again."""
    stop = STAGES.index(until)
    if stop < 3:
        return out
    out.tile, out.timings["tile"] = _timed(ctx, "schedule -> tile", run_tile_passes, out.loop, ctx)
    if stop < 4:
        return out
    # on a CPU a hand-written kernel's threads (st.custom_op) become loops, and the K loops the
    # CPU's instruction forms
    finish = (lambda k: k) if ctx.arch.is_gpu else (lambda k: lower_cpu_forms(to_thread_loops(k)))
    out.kernel, out.timings["kernel"] = _timed(ctx, "lower -> kernel", lower_kernels, out.tile, finish)
    out.kernel = prefetch_weights(out.kernel, ctx)
    verify_program(out.kernel, ctx.arch)
    if stop < 5:
        return out
    language = ctx.arch.language
    out.units, out.timings[language] = _timed(ctx, f"emit -> {language}", emit_units, out.kernel,
                                              ctx.arch)
    if ctx.arch.is_gpu:
        _record_replay(out, ctx)
    return out


def _record_replay(out: Lowered, ctx: Context) -> None:
    """Process replay: with STRATA_REPLAY_LOG=FILE, append "program key <tab> emitted code hash"
    for every program lowered, so two runs of the test suite (before and after a refactor that
    must not change the output) can be compared (`python tests/replay/compare.py BEFORE AFTER`)."""
    path = os.environ.get("STRATA_REPLAY_LOG")
    if not path:
        return
    key = "\0".join([str(out.torch), str(ctx.arch), repr(sorted(ctx.knobs.items()))])
    digest = [hashlib.sha256(t.encode()).hexdigest()[:16] for t in (key, out.source)]
    with open(path, "a") as f:
        f.write("\t".join(digest) + "\n")
