"""`python -m strata.bench.decode [MODEL]`: issue 5's GPU table in one run. Batch-1 greedy decode
of MODEL (default TinyLlama-1.1B, bf16, 128-token prompt, 256 new tokens) with strata's prefill
and step programs, Hugging Face eager and torch.compile (reduce-overhead, static cache), the same
prompt ids for all; prefill ms, decode tokens/s, whether the ids agree, and strata's fraction of
the bandwidth limit (bench/decode_report.py). Markdown and JSON named with model, device, date.

    python -m strata.bench.decode
    python -m strata.bench.decode Qwen/Qwen2.5-0.5B --new-tokens 128 --out docs
    python -m strata.bench.decode --device cpu --dtype fp32 --threads 2
    python -m strata.bench.decode --device cpu --threads 2 --quant q8_0
    python -m strata.bench.decode --gguf /tmp/tinyllama-q4_0.gguf --threads 2

On the CPU (--device cpu) strata's programs run natively (C + OpenMP), torch.compile uses its
default mode (no CUDA graphs), the bandwidth limit is a large sum's read bandwidth, and fewer new
tokens are decoded by default (32: a 1.1B model decodes a few tokens per second on two cores).

MODEL is a bundled name (random weights from the fixed seed, said in the report) or a local
directory with config.json and safetensors weights. A variant that fails is a row saying why.

--rounds R times strata and HF eager in turn, R rounds (bench/decode_rounds.py): the 2-core
machines drift within minutes, and a long prompt's prefill takes a minute a variant.

--gguf FILE (issue 27): the model is that llama GGUF file, loaded as `strata generate FILE.gguf`
loads it (activations in the file's float type, fp32 for Q8_0/Q4_0, unless --dtype), on the CPU;
strata and HF eager run as above and llama.cpp (llama-cpp-python, bench/llama_cpp.py, optional:
`pip install llama-cpp-python`) replaces torch.compile: same file, prompt ids and threads, the
two in turn for --rounds rounds (bench/decode_rounds.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core import progress
from ..core.command import guarded
from ..core.context import Context
from ..core.errors import ModelError, StrataError
from ..models.sampling import Greedy
from ..models.source import resolve
from .decode_kernels import weight_bandwidth
from .decode_report import (DecodeBench, DecodeVariant, HF_EAGER, STRATA, TORCH_COMPILE, goals,
                            kv_bytes_per_token, measure, rich_table, weight_bytes, write)
from .decode_rounds import more_rounds
from .llama_cpp import measure_llama_cpp
from .threads_option import use_threads
from .variants import reason, strata_status, torch_compile

DEFAULT_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"


class UsageError(StrataError):
    """A --gguf argument the benchmark cannot use: one sentence, exit code 2."""
    exit_code = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m strata.bench.decode",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"a bundled model name or a local directory (default {DEFAULT_MODEL})")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="tokens to generate (default 256; 32 on the CPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="cuda (default) or cpu (the default and only choice with --gguf)")
    p.add_argument("--threads", type=int, default=None,
                   help="--device cpu: threads for torch and strata's OpenMP (default: every core)")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"),
                   help="default bf16; with --gguf the file's float type (fp32 for Q8_0/Q4_0)")
    p.add_argument("--quant", choices=("q8_0", "q4_0", "int8", "int4", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m", "fp8"), default=None,
                   help="quantize the linear weights at load (strata/quant); every variant runs "
                        "the same quantized model")
    p.add_argument("--gguf", metavar="FILE", default=None,
                   help="time this llama GGUF file with strata, HF eager and llama.cpp "
                        "(llama-cpp-python) instead of MODEL")
    p.add_argument("--no-hf", action="store_true",
                   help="skip Hugging Face eager (on quantized weights it dequantizes every "
                        "weight each step: minutes a run)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip torch.compile (on quantized weights its CPU step takes minutes to "
                        "compile and runs below 1 token/s)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per variant (default 3)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of strata then the baseline (llama.cpp with --gguf, else HF "
                        "eager), in turn (default 3 with --gguf, else 1; bench/decode_rounds.py)")
    p.add_argument("--out", default="docs", help="report folder (default docs)")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    return p


def check_args(args) -> None:
    if getattr(args, "gguf", None) is not None:
        check_gguf(args)
    if getattr(args, "device", "cuda") is None:
        args.device = "cuda"
    if getattr(args, "dtype", "bf16") is None and getattr(args, "gguf", None) is None:
        args.dtype = "bf16"
    if getattr(args, "rounds", 1) is None:
        args.rounds = 3 if getattr(args, "gguf", None) is not None else 1
    if args.new_tokens is None:
        args.new_tokens = 32 if getattr(args, "device", "cuda") == "cpu" else 256
    if getattr(args, "threads", None) is not None and args.threads < 1:
        raise StrataError(f"--threads must be at least 1, not {args.threads}")
    for flag, value in (("--prompt-len", args.prompt_len), ("--new-tokens", args.new_tokens),
                        ("--repeats", args.repeats), ("--rounds", getattr(args, "rounds", 1))):
        if value < 1:
            raise StrataError(f"{flag} must be at least 1, not {value}")


def check_gguf(args) -> None:
    """--gguf FILE: an existing, readable llama GGUF file, on the CPU, without MODEL or --quant;
    it becomes the MODEL."""
    path = Path(args.gguf).expanduser()
    if args.model != DEFAULT_MODEL:
        raise UsageError(f"--gguf {args.gguf} is the model: give MODEL or --gguf, not both")
    if not path.is_file():
        raise UsageError(f"--gguf {args.gguf}: no such file (give a llama GGUF file)")
    if args.quant is not None:
        raise UsageError("--quant does not apply to --gguf: the file's own weight types are timed")
    if args.device not in (None, "cpu"):
        raise UsageError("--gguf times strata against llama.cpp on the CPU: drop --device cuda")
    from ..models.gguf_file import is_gguf
    if not is_gguf(path):
        raise UsageError(f"--gguf {args.gguf} is not a GGUF file (it does not begin with the bytes "
                         f"GGUF)")
    try:
        resolve(str(path))
    except ModelError as e:
        raise UsageError(f"--gguf: {e}") from None
    args.model, args.device = str(path), "cpu"


def prompt_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    """The prompt every variant decodes from: n random ids from a fixed seed."""
    import torch
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def use_sdpa(lm) -> str:
    """Run the HF variants with transformers' default attention (SDPA) where it can switch;
    strata's programs were captured from the eager-attention model before. Returns the name."""
    try:
        lm.set_attn_implementation("sdpa")
    except Exception:  # noqa: BLE001, S110 - older transformers: keep the model's attention
        pass
    return str(getattr(lm.config, "_attn_implementation", "") or "")


def run_bench(args, say=print, device: str = "cuda", copy_gbps=None, compile_fn=None,
              ctx=None) -> DecodeBench:
    """Build MODEL, then decode with each variant. (Tests run it on the CPU: device="cpu",
    strata on the simulator, a given `copy_gbps` and `compile_fn`.)"""
    import torch

    from ..models.build import DTYPES, build
    from .decode_loops import StaticCompiled, hf_eager_greedy
    quant = getattr(args, "quant", None)
    say(f"building {args.model} ({args.dtype or 'its dtype'}{', ' + quant if quant else ''})")
    built = build(args.model, dtype=args.dtype, materialise=True, quant=quant)
    lm, config, args.dtype = built.model, built.config, built.dtype
    prompt = prompt_ids(config.vocab_size, args.prompt_len)
    n, max_len = args.new_tokens, args.prompt_len + args.new_tokens
    elem = torch.empty((), dtype=DTYPES[args.dtype]).element_size()
    if copy_gbps is None and device == "cpu":
        from .cpu_bench import read_gbps
        say("measuring the read bandwidth of a large sum")
        copy_gbps = read_gbps()
    elif copy_gbps is None:
        from .harness import measure_copy_gbps
        say("measuring the device-to-device copy bandwidth")
        copy_gbps = measure_copy_gbps()
    bench = DecodeBench(built.what, built.weights, args.dtype, args.prompt_len, n, weight_bytes(lm),
                        kv_bytes_per_token(config, elem, args.prompt_len, n), copy_gbps,
                        device="cpu" if device == "cpu" else "cuda")
    say(f"weights: {built.weights}")
    kept, rounds = {}, getattr(args, "rounds", None) or 1
    bench.variants += measure_strata(lm, args, prompt, device, ctx, say, bench, kept)
    if device == "cuda":
        torch.cuda.empty_cache()
    lm = lm.to(device)
    bench.hf_attention = use_sdpa(lm)
    if getattr(args, "no_hf", False):
        bench.variants.append(DecodeVariant(HF_EAGER, "skipped (--no-hf)"))
    else:
        say("decoding with Hugging Face eager")
        eager = lambda k: hf_eager_greedy(lm, prompt, k, device=device)  # noqa: E731
        bench.variants.append(measure(HF_EAGER, eager, n, args.repeats))
        if getattr(args, "gguf", None) is None:     # llama.cpp is the one in turn with --gguf
            pair = [v for v in bench.variants if v.name in (STRATA, HF_EAGER)]
            rows, more = more_rounds(pair, kept.get("run"),
                                     lambda: [measure(HF_EAGER, eager, n, args.repeats, warmups=())],
                                     rounds, n, args.repeats, say)
            done = {r.name: r for r in rows}
            bench.variants = [done.get(v.name, v) for v in bench.variants]
            bench.notes += more
    if getattr(args, "gguf", None) is not None:
        threads = args.threads or torch.get_num_threads()

        def llama_cpp():
            return measure_llama_cpp(args.model, prompt, n, threads, args.repeats, say)
        rows, notes = llama_cpp()
        ours = [v for v in bench.variants if v.name == STRATA]
        rows, more = more_rounds([*ours, *rows], kept.get("run"), lambda: llama_cpp()[0],
                                 rounds, n, args.repeats, say)
        bench.variants = [rows[0] if v.name == STRATA else v
                          for v in bench.variants] + rows[len(ours):]
        bench.notes += notes + more
        return bench
    if getattr(args, "no_compile", False):
        bench.variants.append(DecodeVariant(TORCH_COMPILE, "skipped (--no-compile)"))
        return bench
    say("decoding with torch.compile (compiling the step first)")
    if compile_fn is None and device == "cpu":          # CUDA graphs do not exist there
        compile_fn = lambda fn: torch_compile(fn, None)   # noqa: E731
    try:
        # on a GPU the prefill is compiled too: issue 53's prefill goal is against torch.compile's
        compiled = StaticCompiled(lm, max_len, device, compile_fn, compile_prefill=device == "cuda")
        bench.variants.append(measure(TORCH_COMPILE, lambda k: compiled(prompt, k), n, args.repeats))
    except Exception as e:  # noqa: BLE001 - likewise
        bench.variants.append(DecodeVariant(TORCH_COMPILE, f"failed: {reason(e)}"))
    return bench


def measure_strata(lm, args, prompt, device: str, ctx, say, bench=None,
                   kept=None) -> list[DecodeVariant]:
    """Compile the prefill and step programs (natively for cuda and cpu, else the simulator) and
    measure them; a compile failure is the row's status. On CUDA a second row times the same
    programs with full graph edges instead of programmatic ones (STRATA_PDL=0), and the step's
    weight-reading kernels are timed one by one (bench.notes). Returning frees their GPU weights
    and caches."""
    from ..models.build import DTYPES
    from ..models.decode import compile_decoder, new_caches
    from .decode_loops import strata_greedy
    max_len = args.prompt_len + args.new_tokens
    try:        # the step picks the id itself (one sync per token, as `strata generate`)
        prefill, step = compile_decoder(lm, args.prompt_len, max_len,
                                        device if device in ("cuda", "cpu") else "sim", ctx, say,
                                        sampling=Greedy())
    except Exception as e:  # noqa: BLE001 - strata's row says why; the baselines still run
        return [DecodeVariant(STRATA, strata_status(e))]
    caches = new_caches(lm.config, max_len, DTYPES[args.dtype], device)
    say("decoding with strata")
    run = lambda k: strata_greedy(prefill, step, caches, prompt, k, device=device,  # noqa: E731
                                  picks=Greedy())
    rows = [measure(STRATA, run, args.new_tokens, args.repeats)]
    if kept is not None:            # decode_rounds.py times it again
        kept["run"] = run
    if device == "cuda" and rows[0].ok and step.runtime.programmatic:
        for program in (prefill, step):
            program.runtime.set_programmatic(False)
        rows.append(measure(f"{STRATA}, full graph edges (STRATA_PDL=0)", run, args.new_tokens,
                            args.repeats))
    if device in ("cuda", "cpu") and rows[0].ok and bench is not None:
        import torch
        token = torch.zeros((1, 1), dtype=torch.long, device=device)
        position = torch.full((1,), args.prompt_len, dtype=torch.long, device=device)
        bench.notes += weight_bandwidth(step, (token, position, *caches), bench.copy_gbps,
                                        ceiling="a large sum's read rate" if device == "cpu"
                                        else "the copy bandwidth")
    return rows


def stem(model: str, env, dtype: str = "") -> str:
    from .env import slug
    threads = f"-{env.extra['threads']}t" if "threads" in env.extra else ""
    dtype = f"-{dtype}" if dtype else ""
    name = model.rstrip('/').split('/')[-1].removesuffix(".gguf")
    return (f"decode-{slug(name)}{dtype}-{slug(env.device)}{threads}-"
            f"{env.date[:10]}")


def main(argv=None) -> int:
    from rich.console import Console

    args = build_parser().parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

    def command() -> int:
        check_args(args)
        resolve(args.model)                  # an unknown MODEL fails before the GPU check
        if args.device == "cpu":
            import torch

            from .env import collect_cpu_env
            use_threads(args.threads)
            env = collect_cpu_env(torch.get_num_threads())
            ctx = Context(target="host")
        else:
            from .env import collect_env, strata_target
            from .harness import require_cuda
            require_cuda("the decode benchmark")
            env = collect_env()
            env.extra["strata target"] = strata_target()
            ctx = Context(target=env.extra["strata target"])
        console.print(f"[bold]{env.device}[/]  torch {env.torch}  CUDA {env.cuda}  strata "
                      f"{env.strata}  target {ctx.arch.name}")
        with progress.status("starting") as status:
            bench = run_bench(args, status.update, device=args.device, ctx=ctx)
        console.print(f"model: {bench.model}\nweights: {bench.weights}")
        console.print(rich_table(bench))
        for goal, verdict in goals(bench):
            console.print(f"goal: {goal}: {verdict}")
        dtype = args.dtype + (f"-{args.quant}" if args.quant else "")
        md, js = write(args.out, stem(args.model, env, dtype), bench, env)
        console.print(f"wrote {md} and {js}")
        return 0
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
