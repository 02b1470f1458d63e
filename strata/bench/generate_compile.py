"""`python -m strata.bench.generate_compile [MODEL]`: transformers' `generate` with
`model.forward` compiled, the way transformers recommends, by Inductor and by strata's backend,
against eager; the static and the dynamic cache (issue 52).

    python -m strata.bench.generate_compile                        # TinyLlama-shaped, bf16
    python -m strata.bench.generate_compile --dtype fp32 --layers 4 --cache static

Per variant and cache: the first generate's seconds (it compiles) in a new process with empty
compile caches (strata's and Inductor's point at a new folder) and in another that finds them
filled (a script run a second time), then per-token decode ms of
later generates (interleaved rounds, medians; a token's time is read off a streamer, so the
prefill is apart), whether the greedy ids equal eager's, and how many graphs the second and
later calls compiled (nothing, for Inductor and strata, is the goal), and the seconds of a
generate at a third prompt length, after a second one made the graphs shape-dynamic (what a
user's next new prompt costs; ids compared with eager's too). MODEL is a bundled name
(random weights from a fixed seed) or a local directory; --layers keeps the first N decoder
layers (a whole model's first compile takes minutes on two cores). Markdown under --out, named
with model, dtype, CPU class and date.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time
from unittest import mock

from ..core import progress
from ..core.command import guarded
from ..core.errors import StrataError
from ..models.build import build
from ..torch_compile.backend import strata_backend
from .env import collect_cpu_env, slug
from .table_report import write_report
from .threads_option import use_threads

DEFAULT_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
VARIANTS = ("eager", "inductor", "strata")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m strata.bench.generate_compile",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"a bundled model name or a local directory (default {DEFAULT_MODEL})")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers")
    p.add_argument("--cache", default="static,dynamic", help="static, dynamic or both (default)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens per generate (default 16)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds (default 3)")
    p.add_argument("--threads", type=int, default=None, help="torch's and strata's threads")
    p.add_argument("--out", default="docs/bench", help="report folder (default docs/bench)")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    p.add_argument("--rounds-only", action="store_true",
                   help="only the timed rounds: no first generates in new processes, no other "
                        "prompt lengths (fewer compiles)")
    p.add_argument("--first-generate", choices=VARIANTS, help=argparse.SUPPRESS)  # the new process
    return p


class Stamps:
    """A generate streamer that notes when each token arrives (the first put is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def per_token_ms(self) -> float:
        t = self.times[1:]            # the new tokens: the first comes from the prefill
        return (t[-1] - t[0]) / (len(t) - 1) * 1e3


class Counted:
    """A torch.compile backend that counts the graphs it compiles."""

    def __init__(self, backend):
        self.backend, self.graphs = backend, 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.backend == "strata":
            return strata_backend(gm, example_inputs)
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)


def build_model(args):
    built = build(args.model, dtype=args.dtype, materialise=True)
    lm = built.model.eval()
    if args.layers is not None:
        if not 1 <= args.layers <= len(lm.model.layers):
            raise StrataError(f"--layers {args.layers}: the model has {len(lm.model.layers)}")
        lm.model.layers = lm.model.layers[:args.layers]
        lm.config.num_hidden_layers = args.layers
    try:
        lm.set_attn_implementation("sdpa")    # transformers' default attention
    except Exception:  # noqa: BLE001, S110 - older transformers: keep the model's
        pass
    return lm, built.what


def _compiled(lm, name: str, backends: dict):
    """`lm` itself for eager, else a copy whose forward `name` compiles (counted in backends)."""
    import torch
    if name == "eager":
        return lm
    m = copy.deepcopy(lm)
    backends[name] = Counted(name)
    m.forward = torch.compile(m.forward, backend=backends[name])
    return m


def _inputs(args, lm, cache: str):
    import torch
    ids = torch.randint(0, lm.config.vocab_size, (1, args.prompt_len),
                        generator=torch.Generator().manual_seed(0))
    return ids, dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                     do_sample=False, cache_implementation=cache)


def first_generate(args, cache: str) -> float:
    """Seconds of one variant's first generate, in this process (--first-generate)."""
    import torch
    lm, _ = build_model(args)
    ids, kw = _inputs(args, lm, cache)
    m = _compiled(lm, args.first_generate, {})
    with torch.no_grad():
        t0 = time.perf_counter()
        m.generate(ids, **kw)
        return time.perf_counter() - t0


def first_in_new_process(args, cache: str, name: str) -> float:
    """Seconds of `name`'s first generate in a new Python process, which finds the compile
    caches this one filled."""
    cmd = [sys.executable, "-m", "strata.bench.generate_compile", args.model, "--dtype", args.dtype,
           "--cache", cache, "--prompt-len", str(args.prompt_len), "--new-tokens",
           str(args.new_tokens), "--first-generate", name]
    cmd += ["--layers", str(args.layers)] if args.layers is not None else []
    cmd += ["--threads", str(args.threads)] if args.threads is not None else []
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise StrataError(f"{name}'s first generate in a new process failed: {last}")
    return float(done.stdout.split()[-1])


def run(args, cache: str, say) -> dict:
    """{variant: {cold_s, warm_s, ms (per token, median), same, recompiles}} for one cache kind:
    each variant's first generate in a new process with empty compile caches, then in another
    that finds them filled (a process of its own each: dynamo's record of which sizes changed is
    per process, so a variant compiled after another would be handed other graphs), then the
    timed rounds in this process."""
    with tempfile.TemporaryDirectory(prefix="strata-bench-caches-") as folder, mock.patch.dict(
            os.environ, {"STRATA_CACHE_DIR": os.path.join(folder, "strata"),
                         "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor")}):
        firsts = {}
        for name in VARIANTS if not args.rounds_only else ():
            say(f"{cache} cache: {name}'s first generate in a new process, empty caches")
            cold = first_in_new_process(args, cache, name)
            say(f"{cache} cache: {name}'s first generate in a new process, caches filled")
            firsts[name] = (cold, first_in_new_process(args, cache, name))
        rows = _run(args, cache, say)
    for name in VARIANTS:
        rows[name]["cold_s"], rows[name]["warm_s"] = firsts.get(name, (None, None))
        rows[name].setdefault("new_s", None)
    return rows


def _run(args, cache: str, say) -> dict:
    import torch
    torch._dynamo.reset()
    lm, what = build_model(args)
    ids, kw = _inputs(args, lm, cache)
    backends, rows = {}, {}
    models = {name: _compiled(lm, name, backends) for name in VARIANTS}
    want = None
    with torch.no_grad():
        for name, m in models.items():
            say(f"{cache} cache: first generate with {name}")
            got = m.generate(ids, **kw)
            want = got if want is None else want
            rows[name] = {"same": torch.equal(got, want), "ms": []}
        compiled = {name: b.graphs for name, b in backends.items()}
        for r in range(args.rounds):
            for name, m in models.items():
                say(f"{cache} cache: round {r + 1} of {args.rounds}, {name}")
                stamps = Stamps()
                got = m.generate(ids, streamer=stamps, **kw)
                rows[name]["ms"].append(stamps.per_token_ms())
                rows[name]["same"] &= torch.equal(got, want)
        for name, row in rows.items():
            row["recompiles"] = backends[name].graphs - compiled[name] if name in backends else None
        if not args.rounds_only:
            _other_lengths(args, cache, models, rows, say)
    for name, row in rows.items():
        row["ms"] = statistics.median(row["ms"])
    rows["what"] = what
    return rows


def _other_lengths(args, cache: str, models: dict, rows: dict, say) -> None:
    """Each variant's generate at two other prompt lengths (each a length it has not met): the
    first may compile (dynamo makes the graphs shape-dynamic), the second's seconds are what a
    user's next new prompt costs (`new_s`); ids compared with eager's at each."""
    import torch
    for length in (args.prompt_len + 8, args.prompt_len + 4):
        ids = torch.randint(0, models["eager"].config.vocab_size, (1, length),
                            generator=torch.Generator().manual_seed(length))
        _, kw = _inputs(args, models["eager"], cache)
        want = None
        for name, m in models.items():
            say(f"{cache} cache: a {length}-token prompt with {name}")
            t0 = time.perf_counter()
            got = m.generate(ids, **kw)
            rows[name]["new_s"] = time.perf_counter() - t0
            want = got if want is None else want
            rows[name]["same"] &= torch.equal(got, want)


def table(results: dict) -> tuple[list[str], list[list[str]]]:
    head = ["cache", "variant", "first generate s (new process, empty compile caches)",
            "first generate s (new process, caches filled)",
            "generate s at a third prompt length", "decode ms/token", "eager / variant",
            "ids equal eager's", "graphs compiled after the first call"]
    body = []
    for cache, rows in results.items():
        eager = rows["eager"]["ms"]
        for name in VARIANTS:
            row = rows[name]
            body.append([cache, name, *("-" if row[k] is None else f"{row[k]:.1f}"
                                        for k in ("cold_s", "warm_s", "new_s")),
                         f"{row['ms']:.2f}",
                         f"{eager / row['ms']:.2f}x", "yes" if row["same"] else "NO",
                         "-" if row["recompiles"] is None else str(row["recompiles"])])
    return head, body


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def command() -> int:
        import torch
        caches = [c.strip() for c in args.cache.split(",") if c.strip()]
        if not caches or set(caches) - {"static", "dynamic"}:
            raise StrataError(f"--cache {args.cache!r}: choose static, dynamic or both")
        for flag, value in (("--prompt-len", args.prompt_len), ("--new-tokens", args.new_tokens),
                            ("--rounds", args.rounds)):
            if value < 2 if flag == "--new-tokens" else value < 1:
                raise StrataError(f"{flag} {value} is too small")
        use_threads(args.threads)
        if args.first_generate:
            print(f"{first_generate(args, caches[0]):.3f}")
            return 0
        env = collect_cpu_env(torch.get_num_threads())
        results, what = {}, ""
        with progress.status("starting") as status:
            for cache in caches:
                results[cache] = run(args, cache, status.update)
                what = results[cache].pop("what")
        head, body = table(results)
        layers = f", first {args.layers} layers" if args.layers else ""
        write_report(head, body, title=f"{what}: generate through torch.compile",
                     heading=f"transformers' generate through torch.compile: {what}{layers}",
                     env=env, notes=[
                         f"{args.dtype}, {args.prompt_len}-token prompt, {args.new_tokens} new "
                         f"tokens, {args.rounds} interleaved rounds (medians), `model.forward = "
                         f"torch.compile(model.forward, backend=...)` then `generate`",
                         "first generate: each variant in a new process, strata's and Inductor's "
                         "compile caches in a new empty folder, then in another that finds them "
                         "filled"],
                     out=args.out, stem=f"generate-compile-"
                                        f"{slug(args.model.rstrip('/').split('/')[-1])}-{args.dtype}")
        return 0
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
