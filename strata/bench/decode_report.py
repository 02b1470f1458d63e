"""The numbers and the table of `python -m strata.bench.decode` (issue 53's GPU goals): decode
tokens/s of strata, Hugging Face eager and torch.compile (with --gguf: llama.cpp instead, issue
27's goals), and strata's fraction of the bandwidth limit.

The bandwidth limit: a batch-1 decode step must read every weight once and the KV cache up to its
position, so tokens/s can be no more than copy bandwidth / bytes per token. Bytes per token = all
parameters (an untied input embedding: one row) + K and V of every layer at the average position of
the decode steps. Pure functions of measured numbers: tested on the CPU.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .report import _atomic_write, _env_lines, _md_table, fmt_pct, fmt_ratio
from .results import Ceilings, Env
from .variants import reason

STRATA = "strata"
HF_EAGER = "HF eager"
TORCH_COMPILE = "torch.compile"
LLAMA_CPP = "llama.cpp"     # --gguf: llama-cpp-python on the same file (bench/llama_cpp.py)
VARIANTS = (STRATA, HF_EAGER, TORCH_COMPILE)
GOAL_VS_COMPILE = 2.5       # issue 53: a GPU decode 2.5x torch.compile's reduce-overhead mode
GOAL_BANDWIDTH = {"cuda": 0.75, "cpu": 0.70}    # and at least this fraction of the bandwidth limit
GOAL_CPU_VS_BEST = {"fp32": 1.0, "bf16": 1.5}   # issue 12: vs the faster of HF eager and compile
GOAL_VS_LLAMA_CPP = 1.2         # issue 56 (was 1.1, issue 27): decode tokens/s against llama.cpp, same file
GOAL_PREFILL_VS_LLAMA_CPP = 1.5   # and the prompt's prefill
SHORT_WARMUP = 4        # a second, short warm-up run: strata's prefill captures its graph on call 2


def weight_bytes(model) -> int:
    """Bytes a step reads of the weights: every parameter and every quantized weight's blocks and
    scales (buffers of a QuantLinear), but of an input embedding not tied to the output, one row
    (model.parameters() yields a tied one once; an untied one counted whole made a Q8_0
    TinyLlama-shaped step read 112% of the bandwidth limit)."""
    from ..quant.formats import QuantLinear
    quantized = [b for m in model.modules() if isinstance(m, QuantLinear)
                 for b in m.buffers(recurse=False)]          # qs, d, and a K-quant's sc, mn, dmin
    total = sum(p.numel() * p.element_size() for p in (*model.parameters(), *quantized))
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is not None and getattr(head, "weight", None) is not emb.weight:
        w = emb.weight
        total -= (w.shape[0] - 1) * w[0].numel() * w.element_size()
    return total


def average_kv_len(prompt_len: int, new_tokens: int) -> float:
    """Keys each decode step reads, averaged: the step at position p reads p + 1 of them, for
    p = prompt_len .. prompt_len + new_tokens - 2 (the first new token comes from the prefill)."""
    return prompt_len + new_tokens / 2


def kv_bytes_per_token(config, dtype_bytes: int, prompt_len: int, new_tokens: int) -> float:
    """K and V of every layer read by one decode step at the average position."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_position = 2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes
    return per_position * average_kv_len(prompt_len, new_tokens)


@dataclass
class DecodeVariant:
    """One way of decoding: status "ok" or "failed: <reason>"; medians over `runs` runs."""
    name: str
    status: str = "ok"
    prefill_ms: float | None = None
    tokens_per_s: float | None = None
    steps: int = 0
    runs: int = 0
    ids: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.tokens_per_s is not None


@dataclass
class DecodeBench:
    model: str
    weights: str                   # where the weights come from (random seed or checkpoint)
    dtype: str
    prompt_len: int
    new_tokens: int
    weight_bytes: int
    kv_bytes_per_token: float
    copy_gbps: float | None
    hf_attention: str = ""          # the attention implementation the HF variants ran
    variants: list[DecodeVariant] = field(default_factory=list)
    device: str = "cuda"            # "cpu": native kernels, copy_gbps is a large sum's read GB/s
    notes: list[str] = field(default_factory=list)   # more facts for the report (llama.cpp's)

    def variant(self, name: str) -> DecodeVariant | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def bytes_per_token(self) -> float:
        return self.weight_bytes + self.kv_bytes_per_token

    @property
    def limit_tokens_per_s(self) -> float | None:
        """Copy bandwidth over bytes per token: the most a batch-1 decode can reach."""
        if not self.copy_gbps or self.bytes_per_token <= 0:
            return None
        return self.copy_gbps * 1e9 / self.bytes_per_token


def measure(name: str, run, n: int, repeats: int, warmups=None) -> DecodeVariant:
    """Warm up, then `repeats` timed runs of run(n) -> (ids, prefill s, decode s, steps);
    medians of prefill ms and tokens/s. A failure is the variant's status."""
    try:
        for w in warmups if warmups is not None else (n, min(n, SHORT_WARMUP)):
            run(w)
        runs = [run(n) for _ in range(repeats)]
    except Exception as e:  # noqa: BLE001 - a failing variant is a row, the others still run
        return DecodeVariant(name, f"failed: {reason(e)}")
    steps = runs[-1][3]
    rates = [r[3] / r[2] for r in runs if r[3] and r[2] > 0]
    return DecodeVariant(name, "ok", statistics.median(r[1] * 1e3 for r in runs),
                         statistics.median(rates) if rates else None, steps, len(runs),
                         list(runs[-1][0]))


def fraction_of_limit(b: DecodeBench, name: str) -> float | None:
    v, limit = b.variant(name), b.limit_tokens_per_s
    return v.tokens_per_s / limit if v is not None and v.ok and limit else None


def vs(b: DecodeBench, name: str, reference: str) -> float | None:
    """tokens/s of `name` over those of `reference` (> 1: `name` is faster)."""
    v, r = b.variant(name), b.variant(reference)
    if v is None or r is None or not (v.ok and r.ok) or r.tokens_per_s <= 0:
        return None
    return v.tokens_per_s / r.tokens_per_s


def agree(a: list[int], b: list[int]) -> str:
    if a == b:
        return "yes"
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"no (first difference at generated token {k})"


def vs_best(b: DecodeBench, name: str) -> float | None:
    """tokens/s of `name` over the faster of HF eager and torch.compile (whichever ran)."""
    ratios = [r for r in (vs(b, name, HF_EAGER), vs(b, name, TORCH_COMPILE)) if r is not None]
    return min(ratios) if ratios else None


def llama_cpp(b: DecodeBench) -> DecodeVariant | None:
    """The llama.cpp row strata is held to: the first that ran (its default path, else the
    no_repack retry after a crash); None without --gguf."""
    return next((v for v in b.variants if v.name.startswith(LLAMA_CPP) and v.ok), None)


def reference(b: DecodeBench) -> str:
    """The variant of the "vs" column: llama.cpp's row where one ran, else torch.compile."""
    v = llama_cpp(b)
    return v.name if v is not None else TORCH_COMPILE


def llama_cpp_goals(b: DecodeBench) -> list[tuple[str, str]]:
    """Issue 27's: strata decode >= 1.1x llama.cpp's tokens/s, prefill >= 1.5x its speed."""
    s, ref = b.variant(STRATA), llama_cpp(b)
    names = (f"strata decode ≥ {GOAL_VS_LLAMA_CPP:g}× llama.cpp's on the same file",
             f"strata prefill ≥ {GOAL_PREFILL_VS_LLAMA_CPP:g}× llama.cpp's speed")
    if s is None or not s.ok:
        why = f"not met (strata {s.status.split(':')[0] if s else 'not run'})"
        return [(g, why) for g in names]
    if ref is None:
        return [(g, "— (llama.cpp did not run)") for g in names]
    decode, prefill = s.tokens_per_s / ref.tokens_per_s, ref.prefill_ms / s.prefill_ms
    return [(g, f"{'met' if r >= goal else 'not met'} ({fmt_ratio(r)} against {ref.name})")
            for g, r, goal in zip(names, (decode, prefill),
                                  (GOAL_VS_LLAMA_CPP, GOAL_PREFILL_VS_LLAMA_CPP))]


def goals(b: DecodeBench) -> list[tuple[str, str]]:
    """(goal, verdict) for issue 53's two goals on a GPU (issue 12's on a CPU: against the faster
    of HF eager and torch.compile, 1x in fp32 and 1.5x in bf16; issue 56's two with --gguf)."""
    s = b.variant(STRATA)
    ran = s is not None and s.ok
    f = fraction_of_limit(b, STRATA)
    least = GOAL_BANDWIDTH["cpu" if b.device == "cpu" else "cuda"]
    bandwidth = f"strata ≥ {least:.0%} of the bandwidth limit"
    if not ran:
        why = f"not met (strata {s.status.split(':')[0] if s else 'not run'})"
    else:
        why = ("— (no bandwidth measured)" if f is None else
               f"{'met' if f >= least else 'not met'} ({fmt_pct(f)})")
    if any(v.name.startswith(LLAMA_CPP) for v in b.variants):
        return llama_cpp_goals(b) + [(bandwidth, why)]
    if b.device == "cpu":
        goal = GOAL_CPU_VS_BEST.get(b.dtype, 1.0)
        first, r = f"strata decode ≥ {goal:g}× the faster of HF eager and torch.compile", vs_best(b, STRATA)
    else:
        goal = GOAL_VS_COMPILE
        first, r = f"strata decode ≥ {goal:g}× torch.compile", vs(b, STRATA, TORCH_COMPILE)
    prefill = [] if b.device == "cpu" else [_prefill_goal(b, ran, why)]
    if not ran:
        return [(first, why), (bandwidth, why)] + prefill
    return [(first, "— (no baseline ran)" if r is None else
             f"{'met' if r >= goal else 'not met'} ({fmt_ratio(r)})"), (bandwidth, why)] + prefill


def _prefill_goal(b: DecodeBench, ran: bool, why: str) -> tuple[str, str]:
    """Issue 53's: the prompt's prefill no slower than torch.compile's (its prefill compiled)."""
    goal = f"strata prefill ≥ 1× torch.compile's ({b.prompt_len} tokens, compiled)"
    s, ref = b.variant(STRATA), b.variant(TORCH_COMPILE)
    if not ran:
        return goal, why
    if ref is None or not ref.ok or not ref.prefill_ms or not s.prefill_ms:
        return goal, "— (torch.compile did not run)"
    r = ref.prefill_ms / s.prefill_ms
    return goal, f"{'met' if r >= 1 else 'not met'} ({fmt_ratio(r)})"


COLUMNS = ("variant", "prefill ms", "decode tokens/s", "ms / token", "vs torch.compile",
           "% of bandwidth limit", "ids agree with strata")


def columns(b: DecodeBench) -> tuple[str, ...]:
    return tuple(f"vs {reference(b)}" if c == "vs torch.compile" else c for c in COLUMNS)


def table_rows(b: DecodeBench) -> list[tuple[str, ...]]:
    s, ref = b.variant(STRATA), reference(b)
    rows = []
    for v in b.variants:
        if not v.ok:
            rows.append((v.name, "—", "—", "—", "—", "—", v.status.split(":")[0]))
            continue
        same = "—" if v.name == STRATA or s is None or not s.ok else agree(s.ids, v.ids)
        rows.append((v.name, f"{v.prefill_ms:.2f}", f"{v.tokens_per_s:,.1f}",
                     f"{1e3 / v.tokens_per_s:.3f}", fmt_ratio(vs(b, v.name, ref)),
                     fmt_pct(fraction_of_limit(b, v.name)), same))
    return rows


def _facts(b: DecodeBench) -> list[str]:
    limit = b.limit_tokens_per_s
    copy = f"{b.copy_gbps:,.0f} GB/s" if b.copy_gbps else "—"
    return [f"- model: {b.model}, {b.dtype}, batch 1", f"- weights: {b.weights}",
            (f"- prompt: {b.prompt_len} token ids (random, seed 0); {b.new_tokens} new tokens, "
             f"greedy, no end-of-sequence stop"),
            (f"- bytes per token: {b.bytes_per_token / 1e9:.4g} GB = parameters "
             f"{b.weight_bytes / 1e9:.4g} GB (an untied input embedding: one row) + KV cache at "
             f"the average position {b.kv_bytes_per_token / 1e6:.4g} MB"),
            (f"- bandwidth limit: {'—' if limit is None else f'{limit:,.1f} tokens/s'} "
             f"({'a large sum reading' if b.device == 'cpu' else 'device-to-device copy'} {copy}, "
             f"measured in this run, over bytes per token)"),
            f"- HF variants' attention: {b.hf_attention or '—'}", *(f"- {n}" for n in b.notes)]


def markdown(b: DecodeBench, env: Env) -> str:
    lines = [f"# strata decode: {b.model}", ""]
    lines += _env_lines(env, Ceilings(copy_gbps=b.copy_gbps))[:3] + _facts(b)
    lines += [f"- goal: {g}: **{v}**" for g, v in goals(b)] + [""]
    cpu = b.device == "cpu"
    lines += [("Wall clock of whole greedy runs (argmax on the host every token, synchronised), "
               "after warm-up runs; the median of the timed runs. strata: its prefill and "
               "decode-step programs (" + ("native C + OpenMP kernels" if cpu else
                                           "CUDA graph replay from the second call") +
               "); HF eager: transformers' forward with its DynamicCache; torch.compile: "
               "transformers' StaticCache with the step under torch.compile(" +
               ("default mode, Inductor's C++ backend" if cpu else 'mode="reduce-overhead"') +
               ("), prefill uncompiled as transformers' generate does" if cpu else
                "), the prefill compiled too (a graph of its own)") + ". \"vs torch.compile\": "
               "tokens/s over torch.compile's. Random weights make near-ties of the argmax "
               "likely, so ids may differ between correct implementations in bf16."), ""]
    if any(v.name.startswith(LLAMA_CPP) for v in b.variants):
        lines += [("llama.cpp (--gguf): llama-cpp-python on the same GGUF file, same prompt ids "
                   "and threads, in a child process (a crash is a row); prefill = `eval(prompt "
                   "ids)` and the argmax of its last logits, then one `eval([token])` per new "
                   "token, `reset()` between runs. Its activations are quantized to 8 bits for "
                   "Q8_0/Q4_0 products, so its ids may differ from strata's. torch.compile is "
                   "not run with --gguf."), ""]
    lines += _md_table(columns(b), table_rows(b)) + [""]
    failed = [f"- {v.name}: {v.status}" for v in b.variants if not v.ok]
    if failed:
        lines += ["## Not run", ""] + failed + [""]
    return "\n".join(lines)


def json_report(b: DecodeBench, env: Env) -> dict:
    return {"schema": 1, "benchmark": "decode", "env": asdict(env), "result": asdict(b),
            "bytes_per_token": b.bytes_per_token, "limit_tokens_per_s": b.limit_tokens_per_s,
            "fraction_of_limit": {v.name: fraction_of_limit(b, v.name) for v in b.variants},
            "vs_torch_compile": {v.name: vs(b, v.name, TORCH_COMPILE) for v in b.variants},
            "goals": dict(goals(b))}


def rich_table(b: DecodeBench):
    from rich.table import Table
    table = Table(title=f"decode: {b.model} ({b.dtype}, batch 1, prompt {b.prompt_len}, "
                        f"{b.new_tokens} new tokens)", title_justify="left")
    for c in columns(b):
        table.add_column(c, justify="left" if c in ("variant", "ids agree with strata") else "right")
    for r in table_rows(b):
        table.add_row(*r)
    return table


def write(out_dir, stem: str, b: DecodeBench, env: Env) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    _atomic_write(md, markdown(b, env) + "\n")
    _atomic_write(js, json.dumps(json_report(b, env), indent=1, default=str) + "\n")
    return md, js
