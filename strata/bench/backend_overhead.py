"""`python -m strata.bench.backend_overhead`: the op suite's projections, MLP and decoder block
through `torch.compile(module, backend="strata")` against the same module through
`strata.compile(module)`, on the CPU, interleaved in one run (issue 52: within 5%).

    python -m strata.bench.backend_overhead
    python -m strata.bench.backend_overhead --ops mlp --seq 1,128 --dtype bf16 --rounds 21

What separates the two is only the path into the program: dynamo's guards and its wrapper,
the backend's weight stamps and output structure (frontend/dynamo_graph.py); the program is the
same, weights packed once in both. "dynamo + bare call" is the module under a backend whose
function calls strata.compile's runtime directly on the graph's inputs: what dynamo's own path
costs around a call of this length (more than "dynamo alone", a backend that returns a result made
before: dynamo's prologue runs slower after a long call, its code gone cold), so the last column
is what strata's backend adds of its own. Eager is timed too, for scale. Markdown under --out.
"""
from __future__ import annotations

import argparse
import sys

from ..api import compile as strata_compile
from ..core import progress
from ..core.command import guarded
from ..frontend.dynamo_graph import weight_positions
from . import cases as C
from .cpu_bench import interleaved
from .env import collect_cpu_env
from .table_report import write_report
from .threads_option import use_threads

OPS = ("qkv_proj", "mlp", "decoder_block")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m strata.bench.backend_overhead",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OPS), help=f"a subset of {','.join(C.OPS)}")
    p.add_argument("--seq", default="1,128", help="tokens (default 1,128)")
    p.add_argument("--dtype", default="f32,bf16", help="f32, bf16 or both (default)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    p.add_argument("--threads", type=int, default=None, help="torch's and strata's threads")
    p.add_argument("--out", default="docs/bench", help="report folder (default docs/bench)")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return p


BACKEND, ALONE, BARE = "torch.compile(backend=strata)", "dynamo alone", "dynamo + bare call"


def measure(case, rounds: int) -> dict[str, float]:
    """Milliseconds per call: eager, strata.compile, the backend, dynamo alone (a backend whose
    graph returns a result made before) and dynamo with a bare call of strata.compile's runtime."""
    import torch

    torch._dynamo.reset()
    module, inputs = case.build("cpu")
    with torch.no_grad():
        made = tuple(torch.utils._pytree.tree_leaves(module(*inputs)))    # dynamo's graph: flat
        program = strata_compile(module, inputs, device="cpu")
        run = program.runtime.run

        def bare(gm, example):         # the graph's inputs less the module's parameters
            given = sorted(set(range(len(example))) - set(weight_positions(gm, example)))
            return lambda *a: tuple(run([a[i] for i in given]))
        variants = {"eager": module, "strata.compile": program,
                    BACKEND: torch.compile(module, backend="strata", dynamic=False),
                    ALONE: torch.compile(module, backend=lambda gm, ex: lambda *a: made,
                                         dynamic=False),
                    BARE: torch.compile(module, backend=bare, dynamic=False)}
        return interleaved(variants, inputs, rounds)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def command() -> int:
        import torch
        ops = C.parse_list(args.ops, tuple(C.OPS), "op")
        dts = C.parse_list(args.dtype, ("f32", "bf16"), "dtype", C.DTYPE_ALIASES)
        seqs = [int(s) for s in args.seq.split(",") if s.strip()]
        use_threads(args.threads)
        env = collect_cpu_env(torch.get_num_threads())
        head = ["case", "eager ms", "strata.compile ms", f"{BACKEND} ms", f"{ALONE} ms",
                f"{BARE} ms", "backend / strata.compile", "backend / bare call",
                "backend's own ms (less dynamo + bare call)"]
        body = []
        with progress.status("starting") as status:
            for case in C.cases(("tinyllama",), seqs, dts, ops):
                status.update(f"timing {case.name}")
                ms = measure(case, args.rounds)
                body.append([case.name, *(f"{v:.3f}" for v in ms.values()),
                             f"{ms[BACKEND] / ms['strata.compile']:.3f}x",
                             f"{ms[BACKEND] / ms[BARE]:.3f}x", f"{ms[BACKEND] - ms[BARE]:+.3f}"])
        write_report(head, body, title=f"torch.compile(backend='strata') against strata.compile, "
                                       f"median of {args.rounds} interleaved rounds",
                     heading="torch.compile(backend='strata') against strata.compile", env=env,
                     notes=[f"median of {args.rounds} interleaved rounds; `python -m "
                            f"strata.bench.backend_overhead --ops {args.ops} --seq {args.seq} "
                            f"--dtype {args.dtype}`; above 1.000x the backend is slower"],
                     out=args.out, stem="backend-overhead")
        return 0
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
