"""Greedy decoding loops for comparing decode speed: strata's prefill and step programs, Hugging
Face eager with its own DynamicCache, and the HF model under torch.compile with a StaticCache.

Why one file: every loop is timed the same way (wall clock, synchronised, argmax on the host per
token, as a user's generate loop runs), so their tokens/s compare. Each returns
(generated ids, prefill seconds, decode seconds, decode steps); the first id comes from the
prefill, each later one from a step. `strata generate --compare` uses the same loops.

torch.compile follows transformers' own recipe for it: the prefill runs uncompiled (it also
initialises the static cache), the one-token step runs under torch.compile(mode=
"reduce-overhead"), i.e. CUDA graphs on a GPU; the cache is zeroed in place between runs so the
graphs' addresses stay valid.
"""
from __future__ import annotations

import inspect
import time

import torch

from ..models.decode import greedy, sample
from ..models.hf import transformers
from .variants import torch_compile


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _wants_stop(tok: int, eos) -> bool:
    return bool(eos) and tok in eos


def _last_logits_kw(lm) -> dict:
    """Ask for the last position's logits only (as strata's prefill computes), when the
    transformers version can (logits_to_keep, formerly num_logits_to_keep)."""
    params = inspect.signature(lm.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def hf_eager_greedy(lm, prompt_ids, n: int, eos=(), device="cuda"):
    """Greedy decoding with transformers' own forward and DynamicCache."""
    ids = torch.tensor([list(prompt_ids)], device=device)
    kw = _last_logits_kw(lm)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = lm(input_ids=ids, use_cache=True, **kw)
        toks = [int(out.logits[0, -1].argmax())]
        _sync(device)
        t_prefill = time.perf_counter() - t0
        past, steps = out.past_key_values, 0
        t0 = time.perf_counter()
        while len(toks) < n and not _wants_stop(toks[-1], eos):
            out = lm(input_ids=torch.tensor([[toks[-1]]], device=device), past_key_values=past,
                     use_cache=True, **kw)
            past = out.past_key_values
            toks.append(int(out.logits[0, -1].argmax()))
            steps += 1
        _sync(device)
    return toks, t_prefill, time.perf_counter() - t0, steps


def new_static_cache(lm, max_len: int, device, dtype):
    """transformers' StaticCache for batch 1 and max_len positions (4.x and 5.x spellings)."""
    cls = transformers().StaticCache
    params = inspect.signature(cls.__init__).parameters
    kw = {"config": lm.config, "max_cache_len": max_len}
    for name, value in (("max_batch_size", 1), ("batch_size", 1), ("device", device),
                        ("dtype", dtype)):
        if name in params:
            kw[name] = value
    return cls(**kw)


class StaticCompiled:
    """HF forward with a StaticCache; the decode step under `compile_fn` (default
    torch.compile(mode="reduce-overhead") with fresh dynamo caches), and the prefill too with
    compile_prefill (a graph of its own: static shapes), else eager as transformers' generate runs
    it. Build once, call many times: each compiles on the first run."""

    def __init__(self, lm, max_len: int, device="cuda", compile_fn=None, compile_prefill=False):
        self.lm, self.device = lm, device
        self.cache = new_static_cache(lm, max_len, device, next(lm.parameters()).dtype)
        self.kw = _last_logits_kw(lm)
        self.cache_position = "cache_position" in inspect.signature(
            lm.model.forward if hasattr(lm, "model") else lm.forward).parameters
        # the cache's tensors made by one eager call: made by a compiled call's first run they
        # would be a CUDA graph's outputs, overwritten by its next replay
        with torch.no_grad():
            one = torch.zeros((1, 1), dtype=torch.long, device=device)
            self._forward(one, one[0])
        compile_fn = compile_fn or (lambda fn: torch_compile(fn, "reduce-overhead"))
        self.step = compile_fn(self._forward)
        self.prefill = self.step if compile_prefill else self._forward

    def _forward(self, ids, positions):
        extra = {"cache_position": positions} if self.cache_position else {}
        out = self.lm(input_ids=ids, position_ids=positions[None], past_key_values=self.cache,
                      use_cache=True, **extra, **self.kw)
        return out.logits

    def __call__(self, prompt_ids, n: int, eos=()):
        dev = self.device
        self.cache.reset()
        ids = torch.tensor([list(prompt_ids)], device=dev)
        with torch.no_grad():
            t0 = time.perf_counter()
            logits = self.prefill(ids, torch.arange(len(prompt_ids), device=dev))
            toks = [int(logits[0, -1].argmax())]
            _sync(dev)
            t_prefill = time.perf_counter() - t0
            pos, steps = len(prompt_ids), 0
            t0 = time.perf_counter()
            while len(toks) < n and not _wants_stop(toks[-1], eos):
                logits = self.step(torch.tensor([[toks[-1]]], device=dev),
                                   torch.tensor([pos], device=dev))
                toks.append(int(logits[0, -1].argmax()))
                pos += 1
                steps += 1
            _sync(dev)
        return toks, t_prefill, time.perf_counter() - t0, steps


def strata_greedy(prefill, step, caches, prompt_ids, n: int, eos=(), device="cuda", picks=None):
    """strata's prefill and step programs over `caches` (zeroed first, in place, so a CUDA graph
    captured over them stays valid); picks: Greedy() where they were compiled to return the id."""
    for c in caches:
        c.zero_()
    with torch.no_grad():
        if picks is not None:
            return sample(prefill, step, caches, list(prompt_ids), n, picks, set(eos) or None, device)
        return greedy(prefill, step, caches, list(prompt_ids), n, set(eos) or None, device)
