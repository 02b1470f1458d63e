"""KV-cache decoding of a Hugging Face causal LM as two strata programs sharing a static cache.

Why this shape: a decode step must not recompile per token, so the cache is preallocated
(max_len positions, chosen by the user) and the position is an *input* tensor. The wrapper
modules drive the transformers model's own embedding, rotary embedding, decoder layers, norm and
head, so every family's details (Qwen2's QKV bias, Llama-3 rope scaling, tied embeddings) come
from transformers; only the cache is ours (`StaticKV`, a duck-typed transformers Cache whose
`update` writes the new K/V with `index_copy_` into explicit cache tensors).

    prefill(input_ids (1, S), k_0, v_0, k_1, v_1, ...)          -> logits (1, 1, vocab)
    step(input_ids (1, 1), position (1,), k_0, v_0, ...)        -> logits (1, 1, vocab)

With a `Sampling` (sampling.py) both take the run's uniforms u (max_len,) after their
ids/position, the one a call consumes at the position it reads last (the prefill's S - 1, the
step's `position`), and return the sampled token id (1, 1) instead of the logits; with `Greedy`
they return the argmax id. A step
that returns an id also writes it into its input_ids and adds one to its position, in place: the
next step takes the same two tensors, so a token costs one call and one read of the id (on CUDA,
one graph launch with unchanged pointers and one sync).

Both update the caches in place (the cache inputs are mutated: on CUDA the kernels write only
the new rows of the caller's tensors; the simulator writes them back). Caches are
(1, kv_heads, max_len, head_dim) in the model's dtype and must start finite (zeros): a step
attends over all max_len positions with the positions after `position` masked to the dtype's
minimum (softmax weight exactly 0), as transformers' additive masks do. Prefill attends over the
S new keys only (causal) and writes positions 0..S-1. The logits are the last position's.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from ..api import Program, check_device, on_device
from ..core.context import Context
from ..core.errors import StrataError
from ..frontend.capture import capture
from ..pipeline import lower_torch_program
from ..runtime import native_build
from . import compile_cache, hf, layer_replica
from .sampling import Greedy, needs_uniform, sample_next


class StaticKV:
    """What transformers' attention calls `past_key_values`: update() writes K/V of layer
    `layer_idx` at `positions` into the cache tensors (in place) and returns what attention
    reads: the whole cache for a step, the new keys alone for a prefill."""

    is_compileable = True

    def __init__(self, keys: list, values: list, positions: torch.Tensor, prefill: bool):
        self.keys, self.values, self.positions, self.prefill = keys, values, positions, prefill

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.positions, key_states.to(k.dtype))
        v.index_copy_(2, self.positions, value_states.to(v.dtype))
        if self.prefill:
            return key_states, value_states
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:     # asked by some transformers paths
        return 0


class _Decode(nn.Module):
    """Shared body of the prefill and step programs (see the module docstring)."""

    def __init__(self, model: nn.Module, prefill: bool, sampling=None, layers=None):
        super().__init__()
        self.lm = model
        self.sampling = sampling
        dec = hf.decoder(model, "KV-cache decoding (strata generate)")
        self.embed, self.norm = dec.embed_tokens, dec.norm
        self.layers = dec.layers if layers is None else layers      # layers[:2]: layer_replica.py
        self.rotary_emb = dec.rotary_emb
        self.head = model.get_output_embeddings()
        self.prefill = prefill

    def run(self, input_ids, positions, caches):
        n = len(self.layers)
        if len(caches) != 2 * n:
            raise StrataError(f"expected {2 * n} cache tensors (k and v per layer), got {len(caches)}")
        s = input_ids.shape[1]
        hidden = self.embed(input_ids)
        position_ids = positions.view(1, s)
        cos, sin = self.rotary_emb(hidden, position_ids)
        lowest = torch.finfo(hidden.dtype).min
        if self.prefill:
            mask = torch.full((s, s), lowest, dtype=hidden.dtype, device=hidden.device).triu(1)
        else:
            slots = torch.arange(caches[0].shape[2], device=hidden.device)
            zero = torch.zeros((), dtype=hidden.dtype, device=hidden.device)
            mask = torch.where(slots <= positions, zero, lowest).view(1, -1)
        mask = mask[None, None]
        cache = StaticKV(list(caches[0::2]), list(caches[1::2]), positions, self.prefill)
        for layer in self.layers:
            out = layer(hidden, attention_mask=mask, position_ids=position_ids,
                        position_embeddings=(cos, sin), cache_position=positions,
                        **hf.cache_argument(layer, cache))
            hidden = hf.layer_output(out)
        return self.head(self.norm(hidden[:, -1:]))

    def finish(self, logits, rest, at):
        """(logits, caches), or with sampling (the picked id, caches): the uniforms, if any, are
        rest's first, the one at position `at` (1,) this call's."""
        if self.sampling is None:
            return logits, rest
        if not needs_uniform(self.sampling):
            return sample_next(logits, None, self.sampling), rest
        return sample_next(logits, torch.index_select(rest[0], 0, at), self.sampling), rest[1:]


class Prefill(_Decode):
    def __init__(self, model: nn.Module, sampling=None, layers=None):
        super().__init__(model, prefill=True, sampling=sampling, layers=layers)

    def forward(self, input_ids, *rest):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        caches = rest[1:] if needs_uniform(self.sampling) else rest
        logits = self.run(input_ids, positions, caches)
        return self.finish(logits, rest, positions[-1:])[0]


class DecodeStep(_Decode):
    def __init__(self, model: nn.Module, sampling=None, layers=None):
        super().__init__(model, prefill=False, sampling=sampling, layers=layers)

    def forward(self, input_ids, position, *rest):
        caches = rest[1:] if needs_uniform(self.sampling) else rest
        logits = self.run(input_ids, position, caches)
        picked = self.finish(logits, rest, position)[0]
        if self.sampling is not None:       # the next step's inputs, in place
            input_ids.copy_(picked)
            position.add_(1)
        return picked


def cache_names(n_layers: int) -> list[str]:
    return [f"{kv}_cache_{i}" for i in range(n_layers) for kv in ("k", "v")]


def new_caches(config, max_len: int, dtype: torch.dtype, device="cpu") -> list[torch.Tensor]:
    """Zeroed (1, kv_heads, max_len, head_dim) K and V caches, two per layer (k_0, v_0, k_1 ...)."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = (1, kv_heads, max_len, head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device)
            for _ in range(2 * config.num_hidden_layers)]


def tuning_prefill(model: nn.Module, prompt_len: int, max_len: int) -> tuple[nn.Module, tuple]:
    """The prefill `strata generate` compiles for a prompt of prompt_len tokens (its cache
    writes, the head on the last position only) and its inputs: what `strata tune MODEL` tunes,
    so the schedules it stores are the ones generate's kernels look up."""
    if not 0 < prompt_len <= max_len:
        raise StrataError(f"a prompt of {prompt_len} tokens does not fit a cache of {max_len}")
    ids = torch.zeros((1, prompt_len), dtype=torch.long)
    return Prefill(model).eval(), (ids, *new_caches(model.config, max_len, model_dtype(model)))


def tuning_step(model: nn.Module, position: int, max_len: int) -> tuple[nn.Module, tuple]:
    """A decode step of `model` and its inputs at `position` of a max_len cache whose earlier
    positions hold random keys and values (seeded): the program `strata tune MODEL` tunes and
    checks against eager beside the prefill."""
    if not 0 <= position < max_len:
        raise StrataError(f"position {position} is outside a cache of {max_len} positions")
    caches = new_caches(model.config, max_len, model_dtype(model))
    gen = torch.Generator().manual_seed(0)
    for c in caches:
        c[:, :, :position] = torch.randn(c[:, :, :position].shape, generator=gen).to(c.dtype)
    ids = torch.zeros((1, 1), dtype=torch.long)
    return DecodeStep(model).eval(), (ids, torch.tensor([position]), *caches)


NEW_TOKENS = 16         # what `strata generate` makes unless told (--max-new-tokens's default)


def cache_positions(need: int) -> int:
    """The cache length a generate that needs `need` positions gets when the user names none: the
    next power of two, at least 16, so a longer or shorter --max-new-tokens reuses the compiled
    programs (the length is in their key). The slots past `need` stay masked: no position, and
    so no rotary angle, beyond the ones used is ever computed."""
    return max(16, 1 << (need - 1).bit_length())


def model_dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def compile_decoder(model: nn.Module, prompt_len: int, max_len: int, device: str = "sim",
                    ctx=None, progress=None, sampling=None, threads: int | None = None):
    """(prefill Program for prompts of `prompt_len` tokens, step Program) over a max_len cache;
    with `sampling` they sample the next id in the program (see the module docstring).
    progress(text) is told what is happening; threads: as strata.compile's."""
    check_device(device)
    if prompt_len < 1:
        raise StrataError("the prompt is empty: give at least one token")
    if prompt_len > max_len:
        raise StrataError(f"the prompt has {prompt_len} tokens, more than --max-len {max_len}")
    ctx = on_device(ctx or Context(), device)
    say = progress or (lambda text: None)
    config = model.config
    names = cache_names(config.num_hidden_layers)
    caches = new_caches(config, max_len, model_dtype(model))
    ids = torch.zeros((1, prompt_len), dtype=torch.long)
    u = (torch.zeros(max_len),) if needs_uniform(sampling) else ()
    u_name = ["u"] if needs_uniform(sampling) else []
    programs = []
    for label, kind, inputs, in_names in (
            ("prefill", Prefill, (ids, *u, *caches), ["input_ids", *u_name, *names]),
            ("decode step", DecodeStep, (ids[:, :1], torch.zeros(1, dtype=torch.long), *u, *caches),
             ["input_ids", "position", *u_name, *names])):
        module = kind(model, sampling)
        key = compile_cache.cache_key(model, label, inputs, ctx, sampling)
        lowered = compile_cache.load(key, module)
        if lowered is not None:
            say(f"the {label} from the compile cache (no capture, no lowering)")
        else:
            say(f"capturing the {label} with torch.export")
            torch_program = _capture(kind, module, sampling, inputs, in_names, say)
            say(f"lowering the {label}: {len(torch_program.nodes)} aten ops")
            lowered = lower_torch_program(torch_program, ctx)
            compile_cache.store(key, lowered, module)
        if device == "cpu" and lowered.source:          # gcc builds it while the next lowers
            native_build.build_soon(lowered.source)
        programs.append((label, Program(lowered, device, threads=threads)))
    for label, program in programs:
        if device in ("cuda", "cpu"):
            say(f"compiling the {label} kernels")
            program.load()
    return programs[0][1], programs[1][1]


def _capture(kind, module, sampling, inputs, in_names, say):
    """The Torch IR of `module`: with more than two identical layers, exported with two and the
    rest repeated (layer_replica.py); else, or where that does not hold, exported whole."""
    layers, n = module.layers, len(module.layers)
    if n > 2 and layer_replica.same_layers(layers, getattr(module.lm, "config", None)):
        cut = len(inputs) - 2 * (n - 2)                 # the caches of layers 2.. are the last
        two = capture(kind(module.lm, sampling, layers=layers[:2]).eval(), inputs[:cut],
                      input_names=in_names[:cut])
        program = layer_replica.replicate(
            two, layers, lambda k: cache_names(n)[2 * k:2 * k + 2] if k < n else None)
        if program is not None:
            say(f"exported two of the {n} layers; the other {n - 2} repeat the second")
            return program
        say("the layers are not one template: exporting all of them")
    return capture(module.eval(), inputs, input_names=in_names)


def generate(model, input_ids: torch.Tensor, max_new_tokens: int = 16, device: str = "sim",
             max_len: int | None = None, ctx: Context | None = None, sampling=None,
             threads: int | None = None) -> torch.Tensor:
    """Greedy decoding of a Hugging Face causal LM by strata's compiled prefill and KV-cache decode
    programs; returns (1, prompt + new) ids, as `model.generate(input_ids, do_sample=False)`.
    max_len: the cache's positions (default cache_positions: a power of two).
    With `sampling` (strata.models.sampling.Sampling) the programs sample the next id instead.
    threads: on "cpu", as strata.compile's.

    (strata.generate; here, not in strata/api/, because it drives the compiled Programs.) The path to
    generation with strata: `torch.compile(model, backend="strata").generate(...)`
    runs eager, because PyTorch forwards `.generate` to the uncompiled model."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise StrataError(f"input_ids must be one prompt of shape (1, S), got {tuple(input_ids.shape)}")
    prompt = input_ids[0].tolist()
    max_len = max_len or cache_positions(len(prompt) + max_new_tokens)
    sampling = (sampling or Greedy()).check(model.config.vocab_size)
    prefill, step = compile_decoder(model, len(prompt), max_len, device, ctx, sampling=sampling,
                                    threads=threads)
    where = "cuda" if device == "cuda" else "cpu"
    caches = new_caches(model.config, max_len, model_dtype(model), where)
    eos = eos_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    new, *_ = sample(prefill, step, caches, prompt, max_new_tokens, sampling, eos, where)
    return torch.tensor([prompt + new], dtype=input_ids.dtype, device=input_ids.device)


def eos_ids(raw) -> set[int]:
    """A config's eos_token_id (None, an id or a list of ids) as a set."""
    if raw is None:
        return set()
    return {int(i) for i in raw} if isinstance(raw, (list, tuple)) else {int(raw)}


def greedy(prefill, step, caches: list, prompt_ids: list[int], max_new_tokens: int,
           eos: set[int] | None = None, device="cpu", on_token=None):
    """Greedy decoding with the two programs: (generated ids, prefill seconds, decode seconds,
    decode steps). Stops after max_new_tokens or at an id in `eos`. on_token(count) is told."""
    return _decode(prefill, step, caches, prompt_ids, max_new_tokens, None, eos, device, on_token)


def sample(prefill, step, caches: list, prompt_ids: list[int], max_new_tokens: int, sampling,
           eos: set[int] | None = None, device="cpu", on_token=None):
    """Like greedy, with programs compiled for `sampling` (a Sampling or Greedy), which return
    the picked id: the i-th token of a Sampling's run consumes sampling.uniforms(...)[i], every
    call reading it from one tensor of the run's uniforms by position."""
    return _decode(prefill, step, caches, prompt_ids, max_new_tokens, sampling, eos, device,
                   on_token)


def _decode(prefill, step, caches, prompt_ids, max_new_tokens, sampling, eos, device, on_token):
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    u = ()            # the uniforms by the position a call reads last: one tensor for the run
    if needs_uniform(sampling):
        cache_len = caches[0].shape[2]
        by_position = torch.zeros(cache_len)
        n = min(max_new_tokens, cache_len - len(prompt_ids) + 1)
        first = len(prompt_ids) - 1
        by_position[first:first + n] = sampling.uniforms(max_new_tokens)[:n]
        u = (by_position.to(device),)
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    t0 = time.perf_counter()
    first = prefill(ids, *u, *caches)
    out = [int(first[0, -1].argmax()) if sampling is None else int(first.reshape(-1)[0])]
    sync()
    t_prefill = time.perf_counter() - t0
    # the step's token and position: two device tensors the step itself advances when it picks
    # the id (no host copy; on CUDA its graph keeps its pointers, so no kernel node is updated),
    # else filled in place here
    token = torch.full((1, 1), out[0], dtype=torch.long, device=device)
    position = torch.full((1,), len(prompt_ids), dtype=torch.long, device=device)
    picked = torch.empty((1, 1), dtype=torch.long, device=device)
    t0 = time.perf_counter()
    steps = 0
    while len(out) < max_new_tokens and not (eos and out[-1] in eos):
        if on_token is not None:
            on_token(len(out))
        if sampling is None:
            logits = step(token, position, *caches)
            out.append(int(logits[0, -1].argmax()))
            token.fill_(out[-1])
            position.add_(1)
        else:                           # into one tensor: no new output, no pointer changed
            step(token, position, *u, *caches, out=picked)
            out.append(int(picked))
        steps += 1
    sync()
    return out, t_prefill, time.perf_counter() - t0, steps
