"""The simulator's access counters (kernel_ir/sim_profile.py, `strata run --device sim --profile`):
sectors per global request and wavefronts per shared request against the ideal, on hand-built
kernels whose answer is known, and on the op suite's row kernels."""
import numpy as np
import pytest
import torch

import strata
from kernel_builders import I, V, program
from strata.core import expr as E
from strata.cli import main
from strata.kernel_ir.ir import Buffer, Kernel, Let, Load, Param, Smem, Store, Sync, ThreadIdx
from strata.kernel_ir.sim import simulate
from strata.kernel_ir.sim_profile import profiling

WARP = 32


def _gather(stride: int):
    """out[t] = x[t * stride] for one warp: stride 1 reads 4 sectors, stride 8 (32 bytes) 32."""
    t = V("t")
    body = (Let("t", "i64", ThreadIdx()),
            Let("v", "f32", Load("x", E.mul(t, I(stride)), "f32")),
            Store("out", t, V("v", "f32")))
    k = Kernel("k_gather", (Param("x", "f32", WARP * stride), Param("out", "f32", WARP, output=True)),
               1, WARP, body)
    return program(k, [Buffer("x", "f32", (WARP * stride,), "input"),
                       Buffer("out", "f32", (WARP,), "output")]), WARP * stride


def _shared(stride: int):
    """Each lane writes s[t * stride] then reads it back: stride 32 puts all 32 words in bank 0."""
    t = V("t")
    idx = E.mul(t, I(stride))
    body = (Let("t", "i64", ThreadIdx()), Smem("s", "f32", WARP * stride),
            Store("s", idx, E.Const(1.0, "f32")), Sync(),
            Let("v", "f32", Load("s", idx, "f32")), Store("out", t, V("v", "f32")))
    k = Kernel("k_banks", (Param("out", "f32", WARP, output=True),), 1, WARP, body)
    return program(k, [Buffer("out", "f32", (WARP,), "output")])


@pytest.mark.parametrize("stride, sectors", [(1, 4), (2, 8), (8, 32)])
def test_global_sectors_per_request(stride, sectors):
    prog, n = _gather(stride)
    with profiling() as kernels:
        simulate(prog, {"x": np.arange(n, dtype=np.float32)})
    a = kernels["k_gather"].accesses["global load"]
    assert (a.requests, a.actual, a.ideal) == (1, sectors, 4)
    assert kernels["k_gather"].accesses["global store"].ratio == 1.0


@pytest.mark.parametrize("stride, wavefronts", [(1, 1), (2, 2), (32, 32), (33, 1)])
def test_shared_bank_conflicts(stride, wavefronts):
    with profiling() as kernels:
        simulate(_shared(stride), {})
    for kind in ("shared store", "shared load"):
        a = kernels["k_banks"].accesses[kind]
        assert (a.requests, a.actual, a.ideal) == (1, wavefronts, 1)


def test_counting_is_off_outside_profiling():
    prog, n = _gather(1)
    with profiling() as kernels:
        pass
    simulate(prog, {"x": np.zeros(n, dtype=np.float32)})
    assert kernels == {}


@pytest.mark.parametrize("fn, x", [
    (lambda x: torch.softmax(x, -1), torch.randn(8, 1000)),
    (lambda x: torch.nn.functional.rms_norm(x, (2048,)), torch.randn(4, 2048)),
    (lambda x: torch.nn.functional.silu(x) * 2, torch.randn(3, 5, 77)),
])
def test_row_and_elementwise_kernels_are_coalesced_without_bank_conflicts(fn, x):
    program_ = strata.compile(fn, (x,), device="sim")
    with profiling() as kernels:
        program_(x)
    assert kernels
    for prof in kernels.values():
        for kind, a in prof.accesses.items():
            assert a.ratio == 1.0, (prof.name, kind, a)
        assert prof.accesses["global store"].bytes == prof.minimum_written


def test_profile_command(capsys):
    assert main(["run", "-c", "torch.softmax(torch.randn(8, 1000), dim=-1)", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "k_softmax" in out and "1.00" in out
    assert main(["run", "-c", "torch.relu(torch.randn(4))", "--device", "cpu", "--profile"]) == 2
    assert "use --device sim" in capsys.readouterr().err


def test_occupancy_from_the_target():
    """Blocks per SM and the limit, against the CUDA occupancy rules worked by hand for sm_90:
    65536 registers allocated per warp in 256s, 2048 threads, 32 blocks, 228 KiB of shared memory
    with 1 KiB reserved per block."""
    from strata.core.targets import TARGETS
    sm90 = TARGETS["sm_90"]
    assert sm90.occupancy(256, 32, 0) == (8, "threads")           # 8 x 256 = 2048 threads
    assert sm90.occupancy(128, 168, 0) == (3, "registers")        # 168 x 32 = 5376 per warp: 12 warps
    assert sm90.occupancy(128, 32, 100 * 1024) == (2, "shared memory")   # 228 / 101 KiB
    assert sm90.occupancy(32, 16, 0) == (32, "blocks")
    assert TARGETS["sm_75"].occupancy(256, 32, 0) == (4, "threads")      # 1024 threads on Turing


def test_ptxas_resources_of_emitted_kernels():
    """NVRTC's ptxas report, per kernel: registers, spills and static shared memory."""
    pytest.importorskip("cuda.bindings")
    from strata.runtime.nvrtc import resource_usage
    prog = strata.compile(lambda x, w: (x.softmax(-1) @ w).relu(),
                          (torch.randn(128, 256), torch.randn(256, 64)))
    (unit,) = prog.lowered.units.sources
    use = resource_usage(unit, "sm_90")
    assert set(use) == {k.name for k in prog.kernels}
    for k in prog.kernels:
        assert 0 < use[k.name]["registers"] <= 255
        assert use[k.name]["smem"] == k.smem_bytes       # static shared memory, as Kernel IR says


def test_roofline_estimate_counts_bytes_and_tensor_flops():
    """The H100 estimate is the slowest of bytes at DRAM bandwidth and flops at the tensor rate:
    a bf16 matmul's mma flops are exactly 2 M N K, an elementwise kernel is bound by its bytes."""
    from strata.core.targets import TARGETS
    from strata.tune.cost import gpu_roofline_us
    a, b = torch.randn(128, 256, dtype=torch.bfloat16), torch.randn(256, 128, dtype=torch.bfloat16)
    prog = strata.compile(torch.matmul, (a, b))
    with profiling() as kernels:
        prog(a, b)
    (prof,) = kernels.values()
    assert prof.tensor_flops == 2 * 128 * 256 * 128
    x = torch.randn(1 << 16)
    prog = strata.compile(lambda x: x * 2, (x,))
    with profiling() as kernels:
        prog(x)
    (prof,) = kernels.values()
    h100 = TARGETS["sm_90"]
    assert gpu_roofline_us(prof, h100) == pytest.approx(2 * x.numel() * 4 / h100.dram_gbs / 1e3)
    assert gpu_roofline_us(prof, TARGETS["sm_80"]) is None      # no roofline given for sm_80


def test_profile_command_prints_ptxas_columns(capsys):
    pytest.importorskip("cuda.bindings")
    assert main(["run", "-c", "torch.softmax(torch.randn(8, 1000), dim=-1)", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "regs" in out and "occupancy" in out and "(threads)" in out
