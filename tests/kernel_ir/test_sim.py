"""The simulator computes what the hand-built kernels mean (vs NumPy / torch references)."""
import numpy as np
import pytest
import torch

from strata.core import dtypes, expr as E
from strata.core.errors import InputMismatch
from strata.kernel_ir import sim
from strata.kernel_ir.ir import (Assign, BlockIdx, Buffer, For, If, Kernel, Let, Load, Param, ShflIdx,
                              Store, ThreadIdx)
from strata.kernel_ir.sim import simulate

import kernel_builders as B

RNG = np.random.default_rng(1234)


def rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert not np.isnan(out).any(), "NaN in output (unwritten element?)"
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("n", [1, 1000, 256 * 7, (1 << 20) + 3])
def test_elementwise_predicated_tail(n):
    x, y = randn(n), randn(n)
    out = simulate(B.elementwise(n), {"x": x, "y": y})["out"]
    ref = 2.0 / (1.0 + np.exp(-x.astype(np.float64))) + y
    assert out.dtype == np.float32 and out.shape == (n,)
    assert rel_err(out, ref) < 1e-6


@pytest.mark.parametrize("block", [32, 96, 1024])
def test_elementwise_block_sizes(block):
    n = 3001
    x, y = randn(n), randn(n)
    out = simulate(B.elementwise(n, block=block, op="tanh"), {"x": x, "y": y})["out"]
    assert rel_err(out, np.tanh(x.astype(np.float64)) * 2 + y) < 1e-6


def test_math_runs_in_float32():
    n = 4096
    x, y = randn(n), randn(n)
    out = simulate(B.elementwise(n, op="exp"), {"x": x, "y": y})["out"]
    np.testing.assert_array_equal(out, np.exp(x) * np.float32(2) + y)   # same fp32 ops, same bits


def rms_norm_ref(x, w, eps=1e-6):
    return torch.nn.functional.rms_norm(torch.from_numpy(x).double(), (x.shape[-1],),
                                        torch.from_numpy(w).double(), eps).numpy()


def test_rms_norm_seed_kernel():
    x, w = randn(1, 32, 2048), randn(2048)
    out = simulate(B.rms_norm(), {"x": x, "p_weight": w})["rms_norm"]
    assert out.shape == (1, 32, 2048)
    assert rel_err(out, rms_norm_ref(x, w)) < 1e-6
    eager = torch.nn.RMSNorm(2048, eps=1e-6)
    with torch.no_grad():
        eager.weight.copy_(torch.from_numpy(w))
        np.testing.assert_allclose(out, eager(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [("f16", 2e-3), ("bf16", 1e-2)])
def test_rms_norm_half_precision(dtype, tol):
    x, w = randn(1, 8, 512), randn(512)
    x, w = dtypes.round_to(x, dtype), dtypes.round_to(w, dtype)   # exact in the storage type
    if dtype == "f16":
        x, w = x.astype(np.float16), w.astype(np.float16)
    out = simulate(B.rms_norm(rows=8, cols=512, block=128, dtype=dtype), {"x": x, "p_weight": w})
    out = out["rms_norm"]
    assert out.dtype == (np.float16 if dtype == "f16" else np.float32)
    assert rel_err(out, rms_norm_ref(x.astype(np.float32), w.astype(np.float32))) < tol


def test_batches_give_the_same_answer(monkeypatch):
    x, w = randn(1, 32, 2048), randn(2048)
    whole = simulate(B.rms_norm(), {"x": x, "p_weight": w})["rms_norm"]
    monkeypatch.setattr(sim, "MAX_LANES", 512)          # 2 blocks per batch
    np.testing.assert_array_equal(simulate(B.rms_norm(), {"x": x, "p_weight": w})["rms_norm"], whole)
    n = 5000
    a, b = randn(n), randn(n)
    monkeypatch.setattr(sim, "MAX_LANES", 300)          # 1 block per batch
    out = simulate(B.elementwise(n), {"x": a, "y": b})["out"]
    assert rel_err(out, 2.0 / (1.0 + np.exp(-a.astype(np.float64))) + b) < 1e-6


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_load_store_round_trip(dtype):
    n = 3000
    x = randn(n) * 100
    x = x.astype(np.float16) if dtype == "f16" else x          # bf16 goes in as float32 values
    out = simulate(B.copy(n, dtype), {"x": x})["out"]
    np.testing.assert_array_equal(out, dtypes.round_to(x, dtype) if dtype == "bf16" else x)
    assert out.dtype == x.dtype


@pytest.mark.parametrize("out_dtype", ["f16", "bf16"])
def test_store_rounds_to_storage(out_dtype):
    n = 2000
    x, y = randn(n), randn(n)
    out = simulate(B.elementwise(n, "f32", out_dtype, op="exp"), {"x": x, "y": y})["out"]
    f32 = np.exp(x) * np.float32(2) + y
    want = f32.astype(np.float16) if out_dtype == "f16" else dtypes.round_to(f32, "bf16")
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype,width", [("f32", 4), ("f32", 2), ("f16", 8), ("f16", 4),
                                         ("bf16", 8), ("bf16", 2), ("i32", 4)])
def test_vector_loads_and_stores(dtype, width):
    n = 128 * 8 * 3
    if dtype == "i32":
        x = RNG.integers(-1000, 1000, n).astype(np.int32)
        prog = B.vector_scale(n, dtype, width)
        # the builder multiplies by a float constant; cast back happens in the store
        out = simulate(prog, {"x": x})["out"]
        np.testing.assert_array_equal(out, x * 3)
        return
    x = randn(n)
    x = x.astype(np.float16) if dtype == "f16" else dtypes.round_to(x, dtype)
    out = simulate(B.vector_scale(n, dtype, width), {"x": x})["out"]
    want = x.astype(np.float32) * np.float32(3)
    want = want.astype(np.float16) if dtype == "f16" else dtypes.round_to(want, dtype)
    np.testing.assert_array_equal(out, want)


def one_kernel(body, params, grid, block, name="k_test"):
    k = Kernel(name, tuple(params), grid, block, tuple(body))
    bufs = [Buffer(p.name, p.dtype, (p.numel,), "output" if p.output else "input") for p in params]
    return B.program(k, bufs)


def test_unwritten_outputs_are_poisoned():
    n = 256
    i = B.V("i")
    body = [B.global_index(64), If(E.call("lt", i, B.I(100)), (
        Store("f", i, B.F(1.0)), Store("n", i, E.Cast(i, "i32")), Store("h", i, B.F(2.0))))]
    params = [Param("f", "f32", n, True), Param("n", "i32", n, True), Param("h", "bf16", n, True)]
    out = simulate(one_kernel(body, params, 4, 64), {})
    assert np.isnan(out["f"][100:]).all() and (out["f"][:100] == 1).all()
    assert (out["n"][100:] == np.iinfo(np.int32).min).all()
    assert (out["n"][:100] == np.arange(100)).all()
    assert np.isnan(out["h"][100:]).all() and out["h"].dtype == np.float32


def test_shfl_idx_broadcasts_lane():
    n = 256
    i = B.V("i")
    body = [B.global_index(128), Let("v", "f32", Load("x", i, "f32")),
            Store("out", i, ShflIdx(B.V("v", "f32"), B.I(5), "f32"))]
    x = randn(n)
    out = simulate(one_kernel(body, [Param("x", "f32", n), Param("out", "f32", n, True)], 2, 128),
                   {"x": x})["out"]
    np.testing.assert_array_equal(out, np.repeat(x.reshape(-1, 32)[:, 5], 32))


def test_for_with_per_thread_bounds():
    """out[t] = sum_{k < t} k: every thread leaves the loop at its own iteration."""
    t = B.V("t")
    body = [Let("t", "i64", ThreadIdx()), Let("acc", "i64", B.I(0)),
            For("k", B.I(0), t, 1, (Assign("acc", E.call("add", B.V("acc"), B.V("k", "i32"))),)),
            Store("out", t, B.V("acc"))]
    out = simulate(one_kernel(body, [Param("out", "i64", 64, True)], 1, 64), {})["out"]
    np.testing.assert_array_equal(out, np.arange(64) * (np.arange(64) - 1) // 2)


def test_block_idx_and_int_math():
    n = 1000
    i = B.V("i")
    body = [B.global_index(100),
            Store("out", i, E.add(E.mul(BlockIdx(), 1000), E.mod(E.floordiv(i, 3), 7)))]
    out = simulate(one_kernel(body, [Param("out", "i64", n, True)], 10, 100), {})["out"]
    ii = np.arange(n)
    np.testing.assert_array_equal(out, (ii // 100) * 1000 + (ii // 3) % 7)


def test_inputs_are_checked():
    prog = B.elementwise(100)
    x = randn(100)
    with pytest.raises(InputMismatch, match="'y'"):
        simulate(prog, {"x": x})
    with pytest.raises(InputMismatch, match="float64"):
        simulate(prog, {"x": x, "y": x.astype(np.float64)})
    with pytest.raises(InputMismatch, match=r"\[99\]"):
        simulate(prog, {"x": x, "y": x[:99]})
    with pytest.raises(InputMismatch, match="unexpected"):
        simulate(prog, {"x": x, "y": x, "z": x})


def test_run_kernel_works_in_place_on_flat_storage():
    from strata.core.errors import SimError
    from strata.kernel_ir.sim import run_kernel
    from strata.kernel_ir.sim_memory import poison, to_storage
    k = B.copy(100, "bf16").kernels[0]
    x = randn(100)
    bufs = {"x": to_storage(x, "bf16"), "out": poison("bf16", 100)}
    x_bits = bufs["x"].copy()
    run_kernel(k, bufs)
    np.testing.assert_array_equal(bufs["out"], x_bits)      # bf16 bits copied through f32
    np.testing.assert_array_equal(bufs["x"], x_bits)
    with pytest.raises(SimError, match="buffer x is float32"):
        run_kernel(k, {"x": x, "out": poison("bf16", 100)})
    with pytest.raises(SimError, match="no buffer for parameter out"):
        run_kernel(k, {"x": bufs["x"]})


def test_simulate_leaves_inputs_alone():
    x, y = randn(300), randn(300)
    x0, y0 = x.copy(), y.copy()
    simulate(B.elementwise(300), {"x": x, "y": y})
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)


def test_special_constants():
    x = randn(64)
    x[3] = np.nan
    out = simulate(B.special_constants(), {"x": x})["out"]
    np.testing.assert_array_equal(out[0], x)          # NaN propagates through maximum
    np.testing.assert_array_equal(out[1], x)
    np.testing.assert_array_equal(out[2], x)
