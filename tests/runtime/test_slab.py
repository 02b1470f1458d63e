"""The slab planner: temps placed by liveness in one allocation, never two live ones sharing a byte.

The strong check runs real multi-kernel programs in the simulator with every temp aliased into
one shared NumPy byte slab at the planned offsets (as the CUDA runtime lays them out) and
requires the very same outputs as separate buffers give; a deliberately overlapping plan must
give a different answer, so the check is known to be able to fail."""
import itertools

import numpy as np
import pytest
import torch

from strata.core import dtypes
from strata.api import compile_snippet
from strata.kernel_ir.ir import Buffer, Kernel, KernelProgram, Param
from strata.kernel_ir.sim import simulate
from strata.kernel_ir.sim_memory import storage_numpy
from strata.runtime.slab import (
    ALIGN,
    SlabPlan,
    Slot,
    check_plan,
    live_ranges,
    plan_slab,
)

SM = "torch.softmax({}, -1)"
CHAIN2 = f"{SM.format(SM.format('torch.randn(8, 64)') + ' @ torch.randn(64, 32)')} @ torch.randn(32, 16)"
CHAIN3 = (f"{SM.format(SM.format(SM.format('torch.randn(8, 64)') + ' @ torch.randn(64, 48)') + ' @ torch.randn(48, 32)')}"
          " @ torch.randn(32, 16)")
SNIPPETS = {
    "softmax_matmul_x2": CHAIN2,                                                      # 6 kernels
    "softmax_matmul_x3": CHAIN3,                                                      # 9 kernels
    "sum_softmax": "(torch.randn(8,64).softmax(-1) @ torch.randn(64,16)).sum(0).softmax(-1)",
    "layernorm_between_matmuls":
        "torch.nn.LayerNorm(64)(torch.randn(8,64) @ torch.randn(64,64)) @ torch.randn(64,32)",
    "bf16_softmax_matmul": "torch.log_softmax(torch.randn(8,64,dtype=torch.bfloat16) @ "
                           "torch.randn(64,64,dtype=torch.bfloat16), -1) @ "
                           "torch.randn(64,16,dtype=torch.bfloat16)",
    "i64_and_f32_temps": "torch.softmax(torch.embedding(torch.randn(100,16), "
                         "torch.randn(8,64).argmax(-1)), -1) @ torch.randn(16,8)",
}


def _compiled(code):
    program, snippet = compile_snippet(code)
    feed = {name: _host(x) for name, x in zip(program.torch_program.inputs, snippet.example_inputs)}
    feed.update({k: _host(v) for k, v in program.torch_program.weights.items()})
    return program.lowered.kernel, feed


def _host(t: torch.Tensor) -> np.ndarray:
    t = t.detach().contiguous()
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _slab_views(program, plan: SlabPlan):
    """Every temp as a view of one shared byte slab at its planned offset."""
    slab = np.zeros(plan.total_bytes, dtype=np.uint8)
    views = {}
    for s in plan.slots:
        b = program.buffer(s.name)
        views[s.name] = slab[s.offset:s.offset + s.nbytes].view(storage_numpy(b.dtype))
    return slab, views


def _same(a: dict, b: dict) -> bool:
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k]), equal_nan=a[k].dtype.kind == "f")
               for k in a)


@pytest.fixture(scope="module", params=sorted(SNIPPETS))
def compiled(request):
    return request.param, *_compiled(SNIPPETS[request.param])


def test_programs_are_multi_kernel_with_temps(compiled):
    name, program, _ = compiled
    temps = [b for b in program.buffers if b.kind == "temp"]
    assert len(program.kernels) >= 3 or name == "i64_and_f32_temps", name
    assert temps, name


def test_simulation_on_one_aliased_slab_matches_separate_buffers(compiled):
    name, program, feed = compiled
    plan = plan_slab(program)
    check_plan(plan)
    want = simulate(program, feed)
    _, views = _slab_views(program, plan)
    got = simulate(program, feed, storage=views)
    assert _same(want, got), name
    for k, v in want.items():
        if v.dtype.kind == "f":
            assert not np.isnan(v).any(), f"{name}: {k} has unwritten elements"


def test_plan_reuses_space_in_a_long_chain():
    program, _ = _compiled(CHAIN3)
    plan = plan_slab(program)
    assert plan.total_bytes < plan.unshared_bytes
    offsets = [s.offset for s in plan.slots]
    assert len(set(offsets)) < len(offsets)          # some temps share an offset
    assert str(plan).startswith(f"slab: {plan.total_bytes} bytes")


def test_an_overlapping_plan_gives_a_wrong_answer():
    """All temps at offset 0: live buffers clobber each other and the outputs change. If this
    passed with the bad plan, the aliasing test above could not fail either."""
    program, feed = _compiled(CHAIN2)
    good = plan_slab(program)
    bad = SlabPlan(tuple(Slot(s.name, 0, s.nbytes, s.first, s.last) for s in good.slots),
                   max(s.nbytes for s in good.slots))
    with pytest.raises(ValueError, match="share bytes"):
        check_plan(bad)
    want = simulate(program, feed)
    _, views = _slab_views(program, bad)
    got = simulate(program, feed, storage=views)
    assert not _same(want, got)


# ---------------------------------------------------------------- the planner on its own

def _fake_program(sizes, uses, dtype="f32"):
    """Temps t0.. of `sizes` elements; kernel i names the temps in uses[i]."""
    buffers = [Buffer(f"t{i}", dtype, (n,), "temp") for i, n in enumerate(sizes)]
    kernels = [Kernel(f"k{i}", tuple(Param(f"t{j}", dtype, sizes[j], True) for j in names), 1, 32, ())
               for i, names in enumerate(uses)]
    return KernelProgram(buffers, kernels, [])


def test_live_ranges_are_first_and_last_use():
    p = _fake_program([10, 20, 30, 40], [[0], [0, 1], [1, 2], [2], [0]])
    assert live_ranges(p) == {"t0": (0, 4), "t1": (1, 2), "t2": (2, 3)}     # t3 is never used


def test_dead_buffers_lend_their_space():
    p = _fake_program([1000, 1000, 1000], [[0], [0, 1], [1, 2], [2]])
    plan = plan_slab(p)
    check_plan(plan)
    assert plan.slot("t0").offset == plan.slot("t2").offset        # t0 dies before t2 is born
    assert plan.total_bytes == 2 * 4096
    assert all(s.offset % ALIGN == 0 for s in plan.slots)


def test_best_fit_picks_the_smallest_gap():
    # t0 lives throughout; t1 (2 KiB) and t3 (512 B) die after kernel 0 and leave two holes
    # between the survivors t2 and t4; t5 (128 B) is born in kernel 1 and takes the smaller hole
    p = _fake_program([1024, 512, 256, 128, 64, 32],
                      [[0, 1, 2, 3, 4], [0, 2, 4, 5], [0, 5]])
    plan = plan_slab(p)
    check_plan(plan)
    assert [plan.slot(f"t{i}").offset for i in range(5)] == [0, 4096, 6144, 7168, 7680]
    assert plan.slot("t5").offset == plan.slot("t3").offset     # first fit would take 4096
    assert plan.total_bytes == 7936


def test_no_temps_means_an_empty_slab():
    plan = plan_slab(_fake_program([], [[], []]))
    assert plan.total_bytes == 0 and plan.slots == ()


@pytest.mark.parametrize("seed", range(200))
def test_random_programs_never_overlap_live_temps(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 12)), int(rng.integers(1, 10))
    sizes = [int(rng.integers(0, 5000)) for _ in range(n)]
    uses = [sorted(set(rng.integers(0, n, size=int(rng.integers(0, 4))).tolist())) for _ in range(k)]
    dtype = str(rng.choice(["f32", "bf16", "i64", "u8"]))
    p = _fake_program(sizes, uses, dtype)
    plan = plan_slab(p)
    check_plan(plan)
    ranges = live_ranges(p)
    assert {s.name for s in plan.slots} == set(ranges)
    for s in plan.slots:
        assert s.nbytes == sizes[int(s.name[1:])] * dtypes.ITEMSIZE[dtype]
        assert (s.first, s.last) == ranges[s.name]
    # independently of check_plan: at every kernel, the live temps' byte ranges are disjoint
    for i in range(k):
        live = sorted((s.offset, s.offset + max(s.nbytes, 1)) for s in plan.slots if s.first <= i <= s.last)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(live))
    assert plan.total_bytes <= plan.unshared_bytes
