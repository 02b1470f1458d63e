"""Picking the next token inside the compiled decode programs: greedy, or sampled (temperature,
top-k, top-p).

Why in the program: the step then returns one token id instead of the vocabulary's logits, and
the random number it needs is an input (one uniform per token, drawn on the host from a seeded
torch.Generator), so a run is reproducible from --seed and `sample_next`, run eagerly on the same
logits and the same uniforms, is the reference sampler the tests compare with.

The order is Hugging Face's: logits / temperature, keep the top_k largest (topk: k rounds of
argmax, so k is bounded by MAX_TOP_K), softmax over them, keep the smallest prefix of that
sorted list whose probability reaches top_p (the most likely token always), then inverse-CDF
sampling: the first token whose cumulative probability exceeds u times the kept mass. `Greedy` is
the argmax (the first of equals, as torch.argmax), with no uniform.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import StrataError

MAX_TOP_K = 256
DEFAULT_TOP_K = 50


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = DEFAULT_TOP_K
    top_p: float = 1.0
    seed: int = 0

    def check(self, vocab: int) -> "Sampling":
        if not self.temperature > 0:
            raise StrataError(f"--temperature {self.temperature}: sampling needs a temperature "
                              f"above 0 (leave it out for greedy decoding)")
        if not 1 <= self.top_k <= min(vocab, MAX_TOP_K):
            raise StrataError(f"--top-k {self.top_k}: give 1 to {min(vocab, MAX_TOP_K)} (strata "
                              f"keeps the top-k in k passes over the vocabulary)")
        if not 0 < self.top_p <= 1:
            raise StrataError(f"--top-p {self.top_p}: give a probability in (0, 1]")
        return self

    def uniforms(self, n: int):
        """The n uniforms in [0, 1) a run of n tokens consumes, one per token, from --seed."""
        import torch      # not at import: `strata --help` must not import torch
        g = torch.Generator().manual_seed(self.seed)
        return torch.rand(n, generator=g, dtype=torch.float32)


@dataclass(frozen=True)
class Greedy:
    """The most likely token, picked in the program: a step returns one id, not the logits."""

    def check(self, vocab: int) -> "Greedy":
        return self


def needs_uniform(s) -> bool:
    """Whether programs picking by `s` (a Sampling, Greedy or None: logits) take a uniform u."""
    return isinstance(s, Sampling)


def sample_next(logits, u, s: Sampling | Greedy):
    """The next token id (1, 1) for the last position of `logits` (1, S, vocab) and a uniform
    u (1,) (None for Greedy); written in torch ops so that strata captures it into the program."""
    import torch
    if isinstance(s, Greedy):
        return logits[0, -1].argmax().view(1, 1)
    x = logits[0, -1].float() / s.temperature
    vals, idx = torch.topk(x, s.top_k)
    probs = torch.softmax(vals, dim=-1)
    if s.top_p < 1:
        before = torch.cumsum(probs, dim=-1) - probs          # mass of the more likely tokens
        probs = torch.where(before < s.top_p, probs, torch.zeros_like(probs))
    cdf = torch.cumsum(probs, dim=-1)
    pick = (cdf <= u * cdf[-1:]).sum().clamp(max=s.top_k - 1)
    return torch.gather(idx, 0, pick.view(1)).view(1, 1)
