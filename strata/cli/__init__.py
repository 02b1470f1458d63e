"""The `strata` command: compile a snippet and print any stage, run it and check it against
PyTorch, generate with a model, tune schedules by measuring them, or view the whole compilation
as one HTML page. Errors print one sentence and exit non-zero; --debug shows the traceback instead."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from ..bench.threads_option import add_threads_option, use_threads
from ..core import progress
from ..core.command import guarded
from ..core.context import Context
from ..core.errors import DeviceUnavailable, StrataError
from ..core.knobs import describe_knobs
from ..core.targets import STAGES, get_target
from ..tune import machine
from ..version import __version__
from .generate import add_parser as add_generate, generate_command
from .model import compile_model_command, write_stage
from .tune import add_parser as add_tune, tune_command
from .view import add_parser as add_view, view_command


def _model_options(p: argparse.ArgumentParser) -> None:
    """How a MODEL is built: the options `strata compile` and `strata view` share."""
    p.add_argument("--layer", type=int, metavar="N", help="with MODEL: only decoder layer N")
    p.add_argument("--seq-len", type=int, default=128, metavar="S",
                   help="with MODEL: prompt length the program is compiled for (default 128)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                   help="with MODEL: weight and activation dtype (default: the config's)")
    p.add_argument("--quant", choices=("q8_0", "q4_0", "int8", "int4", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m", "fp8"),
                   help="with MODEL: quantize its linear weights (GGUF's blocks of 32, or int8 per "
                        "channel and int4 per group of 32 with bf16 scales, or fp8: e4m3 weights "
                        "and activations with row scales; strata/quant)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--code", help="a PyTorch expression; torch.randn(...) calls become inputs")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="-v: pass timings and declined fusions/passes; -vv: a diff per tile pass")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="pin a schedule knob printed in a kernel's header (e.g. INSTR=mma, TILE_M=64, "
                        "STAGES=2, SPLIT_K=4, BLOCK_N=64, KV_SPLITS=4, BLOCK=128, VEC=1); --knob help lists them all")
    p.add_argument("--target", default=None,
                   help="what to compile for: a GPU architecture (sm_70 ... sm_90a) or a CPU (cpu, "
                        "cpu-avx2, host); default: the GPU's own with --device cuda (sm_90a on "
                        "H100/H200), else sm_90")
    p.add_argument("--no-tuned", action="store_true",
                   help="ignore schedules `strata tune` recorded for this machine")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description=__doc__)
    parser.add_argument("--version", action="version", version=f"strata {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="lower a program and print one stage")
    c.add_argument("model", nargs="?",
                   help="a bundled model name (TinyLlama/TinyLlama-1.1B-Chat-v1.0, Qwen/Qwen2.5-7B, "
                        "...), a directory with config.json and optional *.safetensors, or a "
                        "llama GGUF file")
    _common(c)
    _model_options(c)
    c.add_argument("--ir", choices=STAGES, help="the stage to print (default: cuda for -c CODE; for "
                                                 "MODEL, a summary of its kernels)")
    c.add_argument("-o", "--output", help="write the printed stage to this file instead of stdout")
    r = sub.add_parser("run", help="compile, execute the kernels and compare with PyTorch eager")
    _common(r)
    r.add_argument("--device", default="sim", choices=("sim", "cuda", "cpu"),
                   help="where the kernels run: sim (the CPU simulator and sanitizer, default), "
                        "cuda (the GPU) or cpu (natively: C with OpenMP, built by the system cc)")
    r.add_argument("--bench", action="store_true",
                   help="after the accuracy check, time against eager and torch.compile "
                        "(--device cuda or cpu)")
    r.add_argument("--profile", action="store_true",
                   help="with --device sim: the simulator's access counters per kernel (coalescing, "
                        "bank conflicts, bytes against the minimum); with --device cuda: --bench "
                        "plus an ncu profile of every kernel, when ncu is installed")
    add_threads_option(r)
    add_generate(sub)
    add_tune(sub)
    add_view(sub, _common, _model_options)
    m = sub.add_parser("machine", help="what strata knows about this CPU: model, features, caches "
                                       "and measured ceilings (cached per machine)")
    m.add_argument("--measure", action="store_true",
                   help="measure the ceilings now (about a minute), even if a profile is cached")
    m.add_argument("--json", action="store_true", help="print the profile as JSON")
    m.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return parser


def _context(args) -> Context:
    knobs = {}
    for item in args.knob:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise StrataError(f"--knob {item!r}: expected NAME=VALUE")
        knobs[name] = value
    return Context(verbosity=args.verbose, knobs=knobs, target=args.target,     # logs: stderr
                   tuned=False if args.no_tuned else None)


def cmd_compile(args) -> int:
    from ..api import compile_snippet
    if args.model and args.code:
        raise StrataError("give either MODEL or -c CODE, not both")
    if not args.model and (args.layer is not None or args.dtype or args.quant):
        raise StrataError("--layer, --dtype and --quant apply to a MODEL; -c snippets take their "
                          "own dtypes")
    if args.model:
        return compile_model_command(args, _context(args))
    if not args.code:
        raise StrataError("nothing to compile: give MODEL or -c CODE")
    args.ir = args.ir or "cuda"
    ctx = _context(args)
    if args.ir in ("c", "asm") and ctx.target is None:
        ctx.target = get_target("host")       # C is the CPU's source: this machine's CPU
    t0 = time.perf_counter()
    program, _ = compile_snippet(args.code, ctx, until=args.ir)
    ctx.log(f"{'total':<28} {(time.perf_counter() - t0) * 1e3:8.2f} ms")
    write_stage(program.ir(args.ir), args)
    return 0


def cmd_run(args) -> int:
    from ..api import check_device, compile_snippet
    from ..bench.check import compare_with_eager, print_report
    if args.profile and args.device == "cpu":
        raise DeviceUnavailable("--profile counts a GPU schedule's memory accesses: use --device "
                                "sim (the simulator's counters) or --device cuda (ncu)")
    if args.bench and args.device == "sim":
        raise DeviceUnavailable("--bench times real kernels: add --device cpu or --device cuda "
                                "(the simulator runs them but cannot time them)")
    check_device(args.device)
    if not args.code:
        raise StrataError("nothing to run: give -c CODE")
    ctx = _context(args)
    if args.bench and args.device == "cpu":
        from ..bench.cpu_bench import bench_snippet_cpu
        return bench_snippet_cpu(args.code, ctx)
    if args.profile and args.device == "sim":
        from ..bench.cli_sim_profile import profile_snippet_sim
        return profile_snippet_sim(args.code, ctx)
    if args.bench or args.profile:
        from ..bench.cli_bench import bench_snippet
        return bench_snippet(args.code, ctx, profile=args.profile)
    program, snippet = compile_snippet(args.code, ctx, device=args.device)
    report = compare_with_eager(program, snippet)
    print_report(program, report)
    return 0 if report.passed else 1


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if "help" in getattr(args, "knob", []):        # `--knob help`: the knob table, nothing else
        print(describe_knobs())
        return 0
    commands = {"compile": cmd_compile, "run": cmd_run, "generate": cmd_generate, "tune": cmd_tune,
                "machine": cmd_machine, "view": cmd_view}

    def command() -> int:
        use_threads(getattr(args, "threads", None))       # run, generate, tune: --threads N
        return commands[args.command](args)
    return guarded(command, args.debug)


def cmd_machine(args) -> int:
    """The cached profile, measured first if there is none or --measure says so."""
    profile = None if args.measure else machine.cached()
    if profile is None:
        from ..bench import machine_probes      # it compiles and times with torch: only here
        with progress.status("measuring this CPU's ceilings") as status:
            profile = machine_probes.measure(status.update)
        print(f"strata: profile cached in {machine.cache_path(profile)}", file=sys.stderr)
    print(json.dumps(dataclasses.asdict(profile), indent=1) if args.json else machine.describe(profile))
    return 0


def cmd_tune(args) -> int:
    return tune_command(args)


def cmd_view(args) -> int:
    return view_command(args, _context(args))


def cmd_generate(args) -> int:
    return generate_command(args)

