"""`strata generate MODEL`: greedy or sampled decoding through strata's kernels with a static KV
cache (sampling: --temperature, --top-k, --top-p, --seed, inside the compiled programs).

Why a command: it is the end-to-end check a user runs on a whole LLM (prefill program + one
decode-step program, strata/models/decode.py) and the tokens/s figure they compare. It prints
where the weights come from, the generated ids on one line (and the text when MODEL is a
directory with tokenizer files or a GGUF file: nothing is downloaded), the prefill time and the
decode tokens/s; `--compare` runs the same greedy decoding with Hugging Face eager (and
torch.compile on a GPU) and says whether the ids agree: on the same weights, since a quantized
model's eager forward runs its QuantLinear modules. The simulator is for tiny configs only.
"""
from __future__ import annotations

import copy
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from ..bench.decode_report import agree
from ..bench.threads_option import add_threads_option
from ..core.errors import ModelError, StrataError
from ..models.sampling import DEFAULT_TOP_K, Greedy, Sampling
from ..models.source import hf_config, resolve
from .model import ProgressContext

# The simulator runs a kernel per thread in NumPy: beyond this many parameters a decode step
# takes minutes, so --device sim refuses (tiny test configs have well under a million).
SIM_MAX_PARAMS = 20_000_000
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
DEFAULT_PROMPT = "Once upon a time"     # when MODEL carries a tokenizer and no prompt is given


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="greedy or sampled decoding of MODEL with a KV cache on strata kernels")
    g.add_argument("model", help="a bundled model name, a directory with config.json, optional "
                                 "*.safetensors and tokenizer files, or a llama GGUF file")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (needs a tokenizer in the MODEL directory or "
                                      f"GGUF file; default with one: {DEFAULT_PROMPT!r})")
    src.add_argument("--prompt-ids", metavar="1,2,3", help="prompt token ids, comma-separated")
    g.add_argument("--max-new-tokens", type=int, default=16, metavar="N",
                   help="tokens to generate (default 16; fewer if an end-of-sequence id comes)")
    g.add_argument("--max-len", type=int, metavar="L",
                   help="KV-cache positions (default: prompt length + max-new-tokens rounded up to "
                        "a power of two, so other --max-new-tokens reuse the compiled programs)")
    add_threads_option(g)
    g.add_argument("--device", default="sim", choices=("sim", "cuda", "cpu"),
                   help="where the kernels run: sim (the CPU simulator, tiny configs), cuda, or "
                        "cpu (natively: C with OpenMP)")
    g.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                   help="weight and activation dtype (default: the config's)")
    g.add_argument("--quant", metavar="FORMAT",
                   help="quantize the linear weights at load: q8_0, q4_0, q4_k, q5_k, q6_k or the "
                        "q4_k_m and q5_k_m mixes (GGUF's block formats), int8 (per channel) or int4 (per group "
                        "of 32), bf16 scales; or fp8 (e4m3 weights and activations, row scales)")
    g.add_argument("--temperature", type=float, metavar="T",
                   help="sample the next token inside the compiled program (default: greedy)")
    g.add_argument("--top-k", type=int, metavar="K",
                   help=f"sample among the K most likely tokens (default {DEFAULT_TOP_K})")
    g.add_argument("--top-p", type=float, metavar="P",
                   help="sample among the most likely tokens holding probability P (default 1)")
    g.add_argument("--seed", type=int, metavar="S",
                   help="seed of the uniforms sampling draws (default 0): the same seed, the same ids")
    g.add_argument("--compare", action="store_true",
                   help="also decode with Hugging Face eager (and torch.compile on a GPU)")
    g.add_argument("-v", "--verbose", action="count", default=0, help="pass timings")
    g.add_argument("--debug", action="store_true", help="show Python tracebacks")


def _tokenizer(source):
    """The tokenizer of a MODEL directory or GGUF file, or None (bundled names carry none)."""
    if source.gguf is not None:
        return source.gguf.tokenizer()
    d = source.directory
    if d is None or not any((Path(d) / f).is_file() for f in TOKENIZER_FILES):
        return None
    from ..models.hf import transformers
    try:
        return transformers().AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except Exception as e:       # a broken tokenizer file: say which directory
        raise ModelError(f"cannot load the tokenizer in {d}: {str(e).splitlines()[0]}") from None


def _prompt_ids(args, tokenizer, vocab: int, source=None) -> list[int]:
    if args.prompt is None and args.prompt_ids is None:       # a tokenizer here: a default prompt
        if tokenizer is None:
            raise StrataError(f"give --prompt-ids 1,2,3 (or --prompt TEXT where MODEL carries a "
                              f"tokenizer): {args.model} has none here")
        args.prompt = DEFAULT_PROMPT
        print(f"strata: no prompt given: {DEFAULT_PROMPT!r}, encoded by {args.model}'s own "
              f"tokenizer", file=sys.stderr)
    if args.prompt is not None:
        gguf = getattr(source, "gguf", None)
        if tokenizer is None and gguf is not None:
            raise StrataError(f"{args.model}: {gguf.tokenizer_problem}, so --prompt TEXT cannot "
                              f"be encoded: give --prompt-ids 1,2,3")
        if tokenizer is None:
            raise StrataError(f"{args.model} has no tokenizer here (bundled configs carry none; a "
                              f"MODEL directory needs tokenizer files), so --prompt TEXT cannot be "
                              f"encoded: give --prompt-ids 1,2,3")
        if not args.prompt.strip():
            raise StrataError("the prompt is empty: give some text")
        ids = tokenizer(args.prompt)["input_ids"]
    else:
        parts = [p.strip() for p in args.prompt_ids.split(",") if p.strip()]
        if not parts:
            raise StrataError("the prompt is empty: give --prompt-ids 1,2,3")
        try:
            ids = [int(p) for p in parts]
        except ValueError:
            raise StrataError(f"--prompt-ids {args.prompt_ids!r}: expected integers separated "
                              f"by commas") from None
    if not ids:
        raise StrataError("the prompt is empty: it encodes to no tokens")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise StrataError(f"prompt id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    return ids


def _check_lengths(args, prompt_len: int) -> int:
    if args.max_new_tokens < 1:
        raise StrataError(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}")
    need = prompt_len + args.max_new_tokens
    from ..models.decode import cache_positions
    max_len = args.max_len if args.max_len is not None else cache_positions(need)
    if max_len < 1:
        raise StrataError(f"--max-len must be at least 1, not {max_len}")
    if need > max_len:
        raise StrataError(f"--max-new-tokens {args.max_new_tokens} does not fit: the prompt "
                          f"({prompt_len} tokens) and the new tokens need {need} cache positions, "
                          f"more than --max-len {max_len}")
    return max_len


def _line(label: str, t_prefill: float, t_decode: float, steps: int) -> str:
    rate = f"{steps / t_decode:.2f} tokens/s" if steps and t_decode > 0 else "no decode step"
    return f"{label}: prefill {t_prefill * 1e3:.1f} ms, decode {steps} steps, {rate}"


def _hf_eager(lm, prompt_ids, n, eos, device):
    """Greedy decoding with transformers' own forward and DynamicCache (bench/decode_loops.py,
    shared with `python -m strata.bench.decode`)."""
    from ..bench.decode_loops import hf_eager_greedy
    return hf_eager_greedy(lm, prompt_ids, n, eos, device)


def _torch_compile(lm, prompt_ids, n, eos):
    """transformers' StaticCache with the decode step under torch.compile(mode="reduce-overhead")
    on the GPU (bench/decode_loops.py): a warm-up run compiles, the second is timed."""
    from ..bench.decode_loops import StaticCompiled
    run = StaticCompiled(lm, len(prompt_ids) + n, "cuda")
    run(prompt_ids, n, eos)
    return run(prompt_ids, n, eos)


def _agree(a, b) -> str:
    return agree(a, b)


def _sampling(args, vocab: int) -> Sampling | None:
    """The --temperature/--top-k/--top-p/--seed choice; None for greedy decoding."""
    if args.temperature is None:
        if any(v is not None for v in (args.top_k, args.top_p, args.seed)):
            raise StrataError("--top-k, --top-p and --seed sample: give --temperature too")
        return None
    return Sampling(args.temperature, DEFAULT_TOP_K if args.top_k is None else args.top_k,
                    1.0 if args.top_p is None else args.top_p,
                    0 if args.seed is None else args.seed).check(vocab)


def generate_command(args) -> int:
    from rich.console import Console

    from ..api import check_device
    from ..models.build import build
    from ..models.decode import compile_decoder, eos_ids, new_caches, sample
    check_device(args.device)
    if args.quant is not None:
        from ..quant.formats import check_format
        check_format(args.quant)
    console = Console(stderr=True, highlight=False)
    spinner = console.status("starting") if args.verbose == 0 else nullcontext()
    with spinner as status:
        step = status.update if status is not None else (lambda text: None)
        source = resolve(args.model)         # bad input fails before any weight is made
        vocab = hf_config(source).vocab_size     # (a config without the model's sizes too)
        tokenizer = _tokenizer(source)
        prompt = _prompt_ids(args, tokenizer, vocab, source)
        max_len = _check_lengths(args, len(prompt))
        sampling = _sampling(args, vocab)
        if sampling is not None and args.compare:
            raise StrataError("--compare checks greedy ids against Hugging Face; leave out "
                              "--temperature (or --compare)")
        step(f"building {args.model}")
        built = build(args.model, dtype=args.dtype, materialise=True, quant=args.quant)
        lm, config = built.model, built.config
        n_params = sum(t.numel() for t in (*lm.parameters(), *lm.buffers()))   # qs: weights too
        if args.device == "sim" and n_params > SIM_MAX_PARAMS:
            raise StrataError(f"{args.model} has {n_params / 1e6:.0f}M parameters: the simulator "
                              f"is for tiny configs (under {SIM_MAX_PARAMS // 1_000_000}M); use "
                              f"--device cpu (natively) or --device cuda")
        ctx = ProgressContext(verbosity=args.verbose, on_step=step)     # logs: stderr
        t0 = time.perf_counter()
        prefill, decode = compile_decoder(lm, len(prompt), max_len, args.device, ctx, step,
                                          sampling or Greedy(), threads=args.threads)
        t_compile = time.perf_counter() - t0
        device = "cuda" if args.device == "cuda" else "cpu"
        caches = new_caches(config, max_len, next(lm.parameters()).dtype, device)
        eos = eos_ids(getattr(config, "eos_token_id", None))
        total = args.max_new_tokens
        on_token = lambda k: step(f"decoding on {args.device}: token {k + 1} of {total}")  # noqa: E731
        ids, t_pre, t_dec, steps = sample(prefill, decode, caches, prompt, total,
                                          sampling or Greedy(), eos, device, on_token=on_token)
        results = [(f"strata ({args.device})", ids, t_pre, t_dec, steps)]
        if args.compare:
            step("decoding with Hugging Face eager")
            lm = lm.to(device)
            results.append((f"hf eager ({device})", *_hf_eager(lm, prompt, total, eos, device)))
            if device == "cuda":
                step("decoding with torch.compile (compiling first)")
                try:
                    results.append(("torch.compile (cuda)", *_torch_compile(lm, prompt, total, eos)))
                except Exception as e:     # a comparison, not strata's result: say why, go on
                    print(f"torch.compile: could not run: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}")
    print(f"model: {built.what}")
    print(f"weights: {built.weights}")
    print(f"prompt: {len(prompt)} tokens; cache: {max_len} positions; compiled in {t_compile:.1f} s")
    if sampling is not None:
        print(f"sampling: temperature {sampling.temperature:g}, top-k {sampling.top_k}, "
              f"top-p {sampling.top_p:g}, seed {sampling.seed} (in the compiled program)")
    for label, toks, t_pre, t_dec, steps in results:
        print(_line(label, t_pre, t_dec, steps))
        print(f"  ids: {' '.join(map(str, toks))}")
        if tokenizer is not None:
            print(f"  text: {tokenizer.decode(toks, skip_special_tokens=True)!r}")
    if args.compare:
        ok = True
        for i, (label, toks, *_) in enumerate(results[1:]):
            text, agrees = _verdict(ids, toks, lm, prompt, total, eos, _int8_rows(decode))
            print(f"ids agree with {label}: {text}")
            ok = ok and (agrees or i > 0)          # the verdict is HF eager's; others are shown
        return 0 if ok else 1
    return 0


def _int8_rows(program) -> bool:
    """Whether a compiled program's quantized rows take int8 activations (QDOT=vnni: on a CPU
    with VNNI or AVX2; a GPU's and other CPUs' rows keep their dtype)."""
    return any(dict(k.knobs).get("QDOT") == "vnni" for k in program.lowered.kernel.kernels)


def _verdict(ids, eager, lm, prompt, total, eos, int8=False) -> tuple[str, bool]:
    """Whether strata's greedy ids are right, told against eager. Where a bf16/fp16 model's ids
    differ, eager itself is rounding: the same model in float32 decides, and the line says who
    it sides with and by what logit margin it picks its token at the first difference. A model
    with block-quantized linears (run with int8 activations where `int8`, as llama.cpp does on
    a CPU) follows no eager trajectory when float32 disagrees too: there `_near_ties` decides."""
    import torch

    from ..quant.formats import QuantLinear
    text = _agree(ids, eager)
    low = next(lm.parameters()).dtype
    k = next((i for i, (a, b) in enumerate(zip(ids, eager)) if a != b), None)
    if text == "yes" or low not in (torch.bfloat16, torch.float16) or k is None:
        return text, text == "yes"
    ref = copy.deepcopy(lm).float().cpu()
    high = _hf_eager(ref, prompt, total, eos, "cpu")[0]
    with torch.no_grad():
        logits = ref(torch.tensor([list(prompt) + ids[:k]])).logits[0, -1]
    margin = float(logits[ids[k]] - logits[eager[k]])
    name = str(low).removeprefix("torch.")
    if high == ids:
        return (f"{text}; hf eager in float32 agrees with strata: at that token it prefers "
                f"{ids[k]} to {eager[k]} by a logit margin of {margin:.3g}, a near tie that "
                f"{name} rounding tipped"), True
    if any(isinstance(m, QuantLinear) for m in lm.modules()):
        return _near_ties(text, ids, lm, ref, prompt, int8)
    return f"{text}; hf eager in float32 disagrees with strata too ({_agree(ids, high)})", False


def _near_ties(text, ids, lm, ref, prompt, int8=True) -> tuple[str, bool]:
    """Fed strata's own ids, float32 eager must rank each of strata's tokens within twice the
    logit change that the model's dtype (and int8 activations, where `int8`) make (eager so, on
    the same ids) of its best token: a wrong kernel moves logits by far more than rounding does."""
    import torch

    from ..quant.formats import QuantLinear
    seq, n = torch.tensor([list(prompt) + ids]), len(ids)
    noisy = copy.deepcopy(lm).cpu()
    for m in noisy.modules():
        if isinstance(m, QuantLinear):
            m.int8_activations = int8
    with torch.no_grad():
        truth = ref(seq).logits[0, -n - 1:-1]
        spread = float((noisy(seq).logits[0, -n - 1:-1].float() - truth).abs().max())
    gaps = truth.max(-1).values - truth[torch.arange(n), torch.tensor(ids)]
    worst = int(gaps.argmax())
    ok = float(gaps[worst]) <= 2 * spread
    name = str(next(lm.parameters()).dtype).removeprefix("torch.")
    cause = "int8 activations move" if int8 else f"{name} rounding moves"
    return (f"{text}; fed strata's ids, hf eager in float32 ranks each of its tokens within "
            f"{float(gaps[worst]):.3g} of its best (at generated token {worst}), "
            f"{'within' if ok else 'beyond'} twice the {spread:.3g} that {cause} "
            f"the logits: {'near ties' if ok else 'strata is wrong'}"), ok
