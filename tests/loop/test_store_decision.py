"""The STORE decision (loop/fuse.py store_choices, loop/lower.py): a value a kernel computes
again (broadcast over an axis it does not depend on, or computed by other kernels too) stored
once by a kernel of its own instead, pinned per kernel signature like any knob, listed in
`--ir loop`, and keeping the kernel's other tuned knobs when it changes the kernel."""
import pytest
import torch

import strata
from conftest import HAS_CC
from strata.core.context import Context
from strata.loop.ir import signature

native = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot run")


def rope_from_positions(q, f):
    """RoPE whose cos and sin are computed from the angles here, broadcast over the heads."""
    e = torch.cat([f, f], -1)
    h = q.shape[-1] // 2
    return q * e.cos() + torch.cat([-q[..., h:], q[..., :h]], -1) * e.sin()


def _inputs(heads=5, seq=7, half=3):           # odd sizes: nothing lines up by luck
    return torch.randn(1, heads, seq, 2 * half), torch.randn(seq, 1) * torch.randn(1, half)


def _loop(fn, inputs, **knobs):
    return strata.compile(fn, inputs, device="sim", ctx=Context(knobs=knobs, tuned=False)).lowered.loop


def test_a_broadcast_value_is_a_choice_listed_with_the_kernel():
    loop = _loop(rope_from_positions, _inputs())
    (k,) = loop.kernels
    assert k.stores == ("cos", "sin") and dict(k.knobs) == {"STORE": 0}
    assert str(loop).splitlines()[0] == "=== k_add -> add === STORE=0 (of 1: cos, 2: sin)"


@pytest.mark.parametrize("n, kernels", [(0, 1), (1, 2), (2, 3), (5, 3)])
def test_store_n_stores_the_first_n_and_matches_eager(n, kernels):
    inputs = _inputs()
    program = strata.compile(rope_from_positions, inputs, device="sim",
                             ctx=Context(knobs={"STORE": n}, tuned=False))
    loop = program.lowered.loop
    assert len(loop.kernels) == kernels
    stored = {b.name for b in loop.buffers if b.kind == "temp"}
    assert stored == set(("cos", "sin")[:min(n, 2)])
    torch.testing.assert_close(program(*inputs), rope_from_positions(*inputs), rtol=1e-5, atol=1e-5)


def test_a_value_two_kernels_compute_is_stored_for_both():
    def two(x):
        y = torch.exp(x) * 3.0                 # inlined into both outputs' kernels
        return y * x, y[:, :5].t() + 1
    x = torch.randn(13, 11)
    default = _loop(two, (x,))
    assert all(k.stores == ("mul",) for k in default.kernels)
    program = strata.compile(two, (x,), device="sim", ctx=Context(knobs={"STORE": 1}, tuned=False))
    loop = program.lowered.loop
    # stored by the first kernel beside its own output (same domain), loaded by the other
    (first, second) = loop.kernels
    assert first.writes == ("mul_1", "mul") and "mul" in second.reads
    for got, want in zip(program(x), two(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_values_computed_once_per_point_are_no_choice():
    # RMSNorm's rstd depends on the row only and is hoisted out of the row's loop; an
    # elementwise chain reads each value at its own point; a 0-d and an empty input likewise
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w   # noqa: E731
    for fn, inputs in [(rms, (torch.randn(4, 33), torch.randn(33))),
                       (lambda x: torch.sigmoid(x) * x + 1, (torch.randn(2, 3, 5),)),
                       (lambda x: x.exp() * 2, (torch.tensor(1.5),)),
                       (lambda x: x.cos() + 1, (torch.randn(0, 4),))]:
        assert all(not k.stores for k in _loop(fn, inputs).kernels)


@native
def test_a_tuned_store_keeps_the_kernels_other_knobs():
    """The tuner pins knobs by the default plan's kernel signature; a STORE that changes the
    kernel keeps that signature (tuning_key), so THREADS pinned beside it still applies."""
    inputs = _inputs(heads=8, seq=16, half=8)
    default = strata.compile(rope_from_positions, inputs, device="cpu", ctx=Context(tuned=False))
    loop = default.lowered.loop
    sig = signature(loop.kernels[0], {b.name: b for b in loop.buffers})
    ctx = Context(tuned=False, kernel_knobs={sig: {"STORE": 2, "THREADS": 1}})
    program = strata.compile(rope_from_positions, inputs, device="cpu", ctx=ctx)
    k = next(k for k in program.lowered.loop.kernels if k.name == "k_add")
    assert k.tuning_key == sig and {"cos", "sin"} <= set(k.reads)
    tile = next(t for t in program.lowered.tile.kernels if t.name == "k_add")
    assert dict(tile.knobs)["THREADS"] == 1 and dict(tile.knobs)["STORE"] == 2
    torch.testing.assert_close(program(*inputs), rope_from_positions(*inputs), rtol=1e-5, atol=1e-5)


@native
def test_a_cpu_stores_a_costly_broadcast_value_by_default():
    """The rule (store._by_rule): a transcendental computed at least 16 times a point, at most
    an eighth of the kernel's output, is stored on a CPU; not across 5 heads, nor on a GPU."""
    many, few = _inputs(heads=32), _inputs(heads=5)
    program = strata.compile(rope_from_positions, many, device="cpu", ctx=Context(tuned=False))
    k = next(k for k in program.lowered.loop.kernels if k.name == "k_add")
    assert dict(k.knobs) == {"STORE": 2} and {"cos", "sin"} <= set(k.reads)
    torch.testing.assert_close(program(*many), rope_from_positions(*many), rtol=1e-5, atol=1e-5)
    cpu_few = strata.compile(rope_from_positions, few, device="cpu", ctx=Context(tuned=False))
    assert [dict(k.knobs) for k in cpu_few.lowered.loop.kernels] == [{"STORE": 0}]
    assert len(_loop(rope_from_positions, many).kernels) == 1           # sim: a GPU target
    back = strata.compile(rope_from_positions, many, device="cpu",
                          ctx=Context(knobs={"STORE": 0}, tuned=False))
    (k,) = back.lowered.loop.kernels
    assert k.tuning_key and "cos" not in k.reads       # planned again, keyed as the rule built it
    torch.testing.assert_close(back(*many), rope_from_positions(*many), rtol=1e-5, atol=1e-5)


def rope_q_and_k(q, k, inv_freq):
    """A whole model's RoPE: the positions an iota (arange + 0) that the mask reads too, cos and
    sin computed once and read by q's and k's rotations."""
    pos = torch.arange(q.shape[2]) + 0
    e = torch.cat([pos.float()[:, None] * inv_freq[None]] * 2, -1)
    cos, sin, h = e.cos(), e.sin(), q.shape[-1] // 2
    rot = lambda x: x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin   # noqa: E731
    return rot(q), rot(k), (pos[:, None] <= pos[None, :]).float()


@native
def test_the_rule_stores_cos_and_sin_where_a_cheap_iota_ranks_above_them():
    """The positions, computed by every kernel reading them, rank first by cost but fail the
    rule; STORE=n stores the first n, so the rule's values are listed first (a whole TinyLlama's
    128-token prefill computed sin and cos in every q rotation: 61 of its 429 ms on Zen 5,
    found by `strata tune`)."""
    inputs = (torch.randn(1, 32, 16, 16), torch.randn(1, 4, 16, 16), torch.rand(8))
    program = strata.compile(rope_q_and_k, inputs, device="cpu", ctx=Context(tuned=False))
    (q_rot,) = [k for k in program.lowered.loop.kernels if k.stores and k.stores[0] == "cos"]
    assert q_rot.stores[:2] == ("cos", "sin") and "add" in q_rot.stores
    assert dict(q_rot.knobs) == {"STORE": 2} and {"cos", "sin"} <= set(q_rot.reads)
    for got, want in zip(program(*inputs), rope_q_and_k(*inputs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
