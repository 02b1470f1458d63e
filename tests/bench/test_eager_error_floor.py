"""The tuner's accuracy floor (twice eager's own error) covers inputs updated in place too.

Why: TinyLlama's bf16 prefill writes its KV caches in place. Held to the plain 1e-2 of a bf16
value, without the floor its outputs get, `strata tune` refused the default schedule on AVX2
("in13 (updated in place): rel err 0.0101", 2026-12-03)."""
import torch

import strata
from strata.bench.check import eager_error, expect, verify


class Chain(torch.nn.Module):
    """40 bf16 roundings a value (eager rounds each step; strata's fused kernel once), written to
    a cache in place."""

    def forward(self, x, cache):
        y = x
        for _ in range(40):
            y = y * 1.01 + 0.003
        cache.copy_(y)
        return y.sum(-1)


class EagerAsProgram:
    """A compiled program's metadata with eager's results: what a schedule exactly as good as
    eager would give."""

    def __init__(self, program, module):
        self.torch_program, self.lowered, self.module = program.torch_program, program.lowered, module

    def __call__(self, *inputs):
        return self.module(*inputs)


def test_eager_itself_passes_with_the_floor_on_a_cache_updated_in_place():
    x, cache = torch.randn(64, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16)
    module = Chain()
    expected = expect(module, [x, cache])
    errors = eager_error(module, expected)
    assert len(errors) == 3                         # the output, then x and the cache
    assert errors[1] == 0.0 and errors[2] > 0.02    # x untouched; the cache well over 1e-2
    program = strata.compile(module, (x, cache), device="cpu")
    eager = EagerAsProgram(program, module)
    floor = [2 * e for e in errors]
    checks = {o.name: o for o in verify(eager, module, [x.clone(), cache.clone()], expected=expected,
                                        floor=floor).outputs}
    assert checks["cache (updated in place)"].passed, checks
    without = {o.name: o for o in verify(eager, module, [x.clone(), cache.clone()], expected=expected,
                                         floor=floor[:1]).outputs}
    assert not without["cache (updated in place)"].passed       # the output's floor alone
    # and strata's own program, one rounding where eager has 40, is held to the same check
    ours = verify(program, module, [x.clone(), cache.clone()], expected=expected, floor=floor)
    assert ours.passed and all(o.rel < 0.01 for o in ours.outputs), ours.outputs
