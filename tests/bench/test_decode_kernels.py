"""bench/decode_kernels.py: the weight bytes each kernel of a real program reads, over kernel
times a stand-in runtime gives (CUDA events need a GPU) or the CPU runtime measures."""
from types import SimpleNamespace

import pytest
import torch

import strata
from conftest import HAS_CC
from strata.bench.decode_kernels import ROLES, role, weight_bandwidth


def test_weight_bandwidth_counts_each_kernels_weights():
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256, bias=False), torch.nn.ReLU(),
                              torch.nn.Linear(256, 32, bias=False))
    with torch.no_grad():
        prog = strata.compile(mlp, (torch.randn(1, 64),))
    kernels = prog.lowered.kernel.kernels
    times = [{"name": k.name, "ms": 0.001 * (i + 1)} for i, k in enumerate(kernels)]
    fake = SimpleNamespace(lowered=prog.lowered,
                           runtime=SimpleNamespace(time_kernels=lambda inputs: times))
    lines = weight_bandwidth(fake, (), copy_gbps=100.0)
    weight_kernels = [k for k in kernels if any(p.name.endswith("weight") for p in k.params)]
    assert len(weight_kernels) >= 1
    total = (64 * 256 + 256 * 32) * 4
    total_ms = sum(t["ms"] for t in times)
    assert lines[0].startswith(f"decode step, all {len(kernels)} kernels one by one: "
                               f"{total_ms:.3f} ms (weight-reading {len(weight_kernels)} in ")
    assert lines[1].startswith(f"decode step, {len(weight_kernels)} weight-reading kernels: "
                               f"{total / 1e6:,.1f} MB")
    first = next(k for k in kernels if any(p.name == "p_0_weight" for p in k.params))
    ms = times[kernels.index(first)]["ms"]
    gbps = (64 * 256 * 4 + (256 * 32 * 4 if any(p.name == "p_2_weight" for p in first.params)
                            else 0)) / ms / 1e6
    assert any(f"{first.name}: {ms * 1e3:.1f} µs" in ln and f"{gbps:,.0f} GB/s, {gbps / 100:.0%}"
               in ln for ln in lines[2:])
    assert weight_bandwidth(fake, (), copy_gbps=None)[1].endswith("GB/s")


def test_each_kernel_of_a_split_step_has_its_role():
    """A decode-shaped step: the split-K GEMV reads the weight, its sum reads the partials, a
    write into an input (the cache) is a cache write."""
    def step(x, w, cache, position):
        cache.index_copy_(0, position, x)
        return torch.nn.functional.linear(x, w)
    args = (torch.randn(1, 2048), torch.randn(64, 2048), torch.zeros(4, 2048), torch.tensor([1]))
    with torch.no_grad():
        prog = strata.compile(step, args, device="sim")
    kp = prog.lowered.kernel
    weights = {b.name for b in kp.buffers if b.kind in ("weight", "input") and b.shape == (64, 2048)}
    inputs = {b.name for b in kp.buffers if b.kind == "input"}
    roles = [role(k, weights, inputs) for k in kp.kernels]
    assert ROLES[0] in roles and ROLES[1] in roles and ROLES[3] in roles, \
        [(k.name, r) for k, r in zip(kp.kernels, roles)]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built here "
                                       "(install gcc)")
def test_a_cpu_step_times_its_kernels_and_counts_a_looked_up_row_not_the_table():
    """NativeProgram.time_kernels times each kernel in launch order; a token's embedding row is
    looked up through the ids, so the table's 4 MB are not counted as read."""
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8192, 128)
            self.proj = torch.nn.Linear(128, 512, bias=False)

        def forward(self, ids):
            return self.proj(torch.nn.functional.silu(self.embed(ids)))
    ids = torch.tensor([[5]])
    with torch.no_grad():
        prog = strata.compile(Step().eval(), (ids,), device="cpu")
    timings = prog.runtime.time_kernels((ids,), warmup=1, reps=3)
    assert [t["name"] for t in timings] == [k.name for k in prog.lowered.kernel.kernels]
    assert all(t["ms"] > 0 for t in timings)
    lines = weight_bandwidth(prog, (ids,), copy_gbps=None)
    assert f"{128 * 512 * 4 / 1e6:,.1f} MB" in lines[1], lines     # the projection's weight only
