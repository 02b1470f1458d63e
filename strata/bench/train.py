"""`python -m strata.bench.train --device cpu`: one training step (forward, backward, AdamW) of
the op suite's TinyLlama-shaped modules, eager against torch.compile with Inductor and with
strata's backend (issue 58), on the CPU or a GPU, interleaved in one run.

    python -m strata.bench.train --device cpu
    python -m strata.bench.train --device cpu --ops mlp --seq 64 --rounds 9
    python -m strata.bench.train --device cuda --seq 1024     # the flash attention backward

A step is `loss = module(*inputs).float().pow(2).mean(); loss.backward(); opt.step();
opt.zero_grad()` with torch.optim.AdamW. The optimizer step is compiled too, as users of
Inductor's best mode do (`torch.compile(opt.step)`): with Inductor in the Inductor variant, with
strata in strata's, eager in eager's; --eager-step runs it eagerly in every variant (the rows
before issue 58's compiled step). Each variant trains its own copy of the same weights; the last
step's losses are compared (they must agree within 1e-3 relative, 2e-2 under bf16 autocast,
else the row says so). --dtype bf16 runs the forward under torch.autocast(bfloat16), the weights
and the optimizer in f32, as mixed-precision training does; the default, f32,bf16, measures both
in one run, so that issue 58's goal (1.2x the faster of eager and Inductor, geomean over the
cases) is read from one run's rows. tokens/s = tokens per step / the median step. Markdown under
--out, named with CPU class and date; its header names the process's malloc. Under glibc's, a
fresh gradient faults a page every 4 KiB (and zero_grad unmaps it), which strata's runtime avoids
by reusing a dropped output's memory, and eager and Inductor do not; so the benchmark runs itself
again with tcmalloc preloaded (their best, as PyTorch's CPU tuning guide advises) unless a malloc
is preloaded already or --allocator as-is. On cuda a step is timed between two
synchronizations, and strata's attention trains through its flash kernels (torch_compile/
attention_op.py).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

from ..core import progress
from ..core.command import guarded
from ..core.errors import StrataError
from . import cases as C
from .env import collect_cpu_env, collect_env, rerun_with_tcmalloc
from .harness import require_cuda
from .table_report import write_report
from .threads_option import use_threads

VARIANTS = ("eager", "inductor", "strata")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m strata.bench.train",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (default) or cuda")
    p.add_argument("--ops", default="mlp,decoder_block", help="op suite modules (default "
                                                              "mlp,decoder_block)")
    p.add_argument("--seq", type=int, default=128, help="tokens per step (default 128)")
    p.add_argument("--dtype", default="f32,bf16", help="f32 and/or bf16: the forward under "
                   "torch.autocast(bfloat16), f32 weights and optimizer (default f32,bf16)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds (default 5)")
    p.add_argument("--threads", type=int, default=None, help="torch's and strata's threads")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--compile-step", dest="compile_step", action="store_true", default=True,
                      help="compile opt.step with the variant's backend (the default)")
    step.add_argument("--eager-step", dest="compile_step", action="store_false",
                      help="run opt.step eagerly in every variant")
    p.add_argument("--allocator", choices=("tcmalloc", "as-is"), default="tcmalloc",
                   help="tcmalloc (the default: preloaded, the baselines' best) or as-is (the "
                   "process's own malloc, glibc's unless LD_PRELOAD says otherwise)")
    p.add_argument("--out", default="docs/bench", help="report folder (default docs/bench)")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return p


def measure(case, rounds: int, say, compile_step: bool = True, autocast=None,
            device: str = "cpu") -> dict:
    """{variant: (median step s, last loss)}; a variant that fails is (None, its reason)."""
    import torch
    torch._dynamo.reset()
    module, inputs = case.build(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    module.requires_grad_(True).train()
    runs = {}
    for name in VARIANTS:
        m = copy.deepcopy(module)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        if name == "eager":
            runs[name] = (m, opt.step, opt)
            continue
        backend = "strata" if name == "strata" else "inductor"
        runs[name] = (torch.compile(m, backend=backend, dynamic=False),
                      torch.compile(opt.step, backend=backend) if compile_step else opt.step, opt)

    def step(name) -> tuple[float, float]:
        fn, opt_step, opt = runs[name]
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
            loss = fn(*inputs).float().pow(2).mean()
        loss.backward()
        opt_step()
        opt.zero_grad()
        sync()
        return time.perf_counter() - t0, loss.item()
    out, times = {}, {name: [] for name in VARIANTS}
    for name in VARIANTS:
        say(f"{case.name}: first step with {name} (compiles)")
        try:
            step(name)
        except Exception as e:  # noqa: BLE001 - a failing variant is a row, the run goes on
            out[name] = (None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    for r in range(rounds):       # each round in another order: a variant's step does not
        turn = r % len(VARIANTS)  # always follow the same other's (whose freed memory it gets)
        for name in VARIANTS[turn:] + VARIANTS[:turn]:
            if name in out:
                continue
            say(f"{case.name}: round {r + 1} of {rounds}, {name}")
            dt, loss = step(name)
            times[name].append((dt, loss))
    for name in VARIANTS:
        if name not in out:
            out[name] = (statistics.median(t for t, _ in times[name]), times[name][-1][1])
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.allocator == "tcmalloc" and argv is None and args.device == "cpu":
        rerun_with_tcmalloc("strata.bench.train", sys.argv[1:])

    def command() -> int:
        import torch
        ops = C.parse_list(args.ops, tuple(C.OPS), "op")
        dtypes = args.dtype.split(",")
        if not dtypes or not set(dtypes) <= {"f32", "bf16"}:
            raise StrataError(f"--dtype {args.dtype}: training is measured in f32 and/or bf16 "
                              f"(autocast), for example --dtype f32,bf16")
        if args.seq < 1 or args.rounds < 1:
            raise StrataError("--seq and --rounds must be at least 1")
        use_threads(args.threads)
        if args.device == "cuda":
            require_cuda("--device cuda")
        env = collect_cpu_env(torch.get_num_threads()) if args.device == "cpu" else collect_env()
        head = ["case", *(f"{v} tokens/s" for v in VARIANTS), "strata / eager",
                "strata / Inductor", "strata / the faster", "last losses agree"]
        body, best = [], []
        step = ("its step compiled by each variant's backend" if args.compile_step else
                "its step eager in every variant")
        with progress.status("starting") as status:
            for case, dtype in [(c, d) for d in dtypes
                                for c in C.cases(("tinyllama",), [args.seq], ["f32"], ops)]:
                autocast = torch.bfloat16 if dtype == "bf16" else None
                res = measure(case, args.rounds, status.update, args.compile_step, autocast,
                              args.device)
                rate = {n: args.seq / t if t else None for n, (t, _) in res.items()}
                ok = [res[n][1] for n in VARIANTS if rate[n]]
                tol = 1e-3 if autocast is None else 2e-2     # bf16 products: 8 bits
                agree = all(abs(a - ok[0]) <= tol * abs(ok[0]) for a in ok)
                ratio = [f"{rate['strata'] / rate[n]:.2f}x" if rate["strata"] and rate[n] else "-"
                         for n in ("eager", "inductor")]
                others = [rate[n] for n in ("eager", "inductor") if rate[n]]
                if rate["strata"] and others:
                    best.append(rate["strata"] / max(others))
                body.append([f"{case.name} (bf16 autocast)" if autocast else case.name,
                             *(f"{rate[n]:.1f}" if rate[n] else res[n][1] for n in VARIANTS),
                             *ratio, f"{best[-1]:.2f}x" if rate["strata"] and others else "-",
                             "yes" if agree else "NO"])
        geomean = statistics.geometric_mean(best) if best else None
        write_report(head, body, title=f"one training step, AdamW, median of {args.rounds} rounds",
                     heading="One training step through torch.compile: eager, Inductor, strata",
                     env=env, notes=[f"{args.seq} tokens per step, AdamW ({step}), median of "
                                     f"{args.rounds} interleaved rounds; `python -m "
                                     f"strata.bench.train --ops {args.ops} --seq {args.seq} "
                                     f"--dtype {args.dtype}"
                                     f"{'' if args.compile_step else ' --eager-step'}`",
                                     "strata against the faster of eager and Inductor, geomean "
                                     f"over the {len(best)} cases: " + (f"**{geomean:.2f}x** "
                                     f"(issue 58's goal: 1.2x)" if geomean else "not measured")],
                     out=args.out, stem="train")
        return 0
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
