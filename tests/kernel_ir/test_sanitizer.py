"""The simulator as sanitizer: each broken kernel raises SimError naming what and who; the
corrected version of the same kernel runs clean."""
import numpy as np
import pytest

from strata.core import expr as E
from strata.core.errors import SimError
from strata.kernel_ir.ir import (BlockIdx, Buffer, For, If, Kernel, Let, Load, LoadVec, Param,
                              ShflXor, Smem, Store, StoreVec, Sync, ThreadIdx)
from strata.kernel_ir.sim import simulate

import kernel_builders as B

RNG = np.random.default_rng(7)
i, t = B.V("i"), B.V("t")


def run(body, params, grid, block, inputs=None):
    k = Kernel("k_bad", tuple(params), grid, block, tuple(body))
    bufs = [Buffer(p.name, p.dtype, (p.numel,), "output" if p.output else "input") for p in params]
    return simulate(B.program(k, bufs), inputs or {})


def xin(n):
    return {"x": RNG.standard_normal(n).astype(np.float32)}


IO = lambda n: [Param("x", "f32", n), Param("out", "f32", n, True)]  # noqa: E731


def test_out_of_bounds_load_names_buffer_index_and_thread():
    n = 1000
    body = [B.global_index(256), Store("out", E.mod(i, n), Load("x", i, "f32"))]
    with pytest.raises(SimError, match=r"k_bad: out-of-bounds load of x\[1000\] \(size 1000\) "
                                       r"by block 3, thread 232"):
        run(body, IO(n), 4, 256, xin(n))


def test_out_of_bounds_store():
    n = 1000
    body = [B.global_index(256), If(E.call("lt", i, B.I(n)), (Store("out", E.add(i, 1), B.F(0)),))]
    with pytest.raises(SimError, match=r"out-of-bounds store to out\[1000\].*block 3, thread 231"):
        run(body, IO(n), 4, 256, xin(n))


def test_out_of_bounds_shared_store():
    body = [Smem("s", "f32", 64), Let("t", "i64", ThreadIdx()), Store("s", t, B.F(1.0))]
    with pytest.raises(SimError, match=r"out-of-bounds shared store to s\[64\] \(size 64\) "
                                       r"by block 0, thread 64"):
        run(body, IO(128), 1, 128, xin(128))


def test_store_to_read_only_param():
    body = [B.global_index(32), Store("x", i, B.F(1.0))]
    with pytest.raises(SimError, match="read-only parameter x"):
        run(body, IO(32), 1, 32, xin(32))


def neighbour_exchange(sync: bool):
    """s[t] = x[i]; (Sync); out[i] = s[(t + 1) % 64]"""
    return [Smem("s", "f32", 64), B.global_index(64), Let("t", "i64", ThreadIdx()),
            Store("s", t, Load("x", i, "f32")),
            *([Sync()] if sync else []),
            Store("out", i, Load("s", E.mod(E.add(t, 1), 64), "f32"))]


def test_smem_read_after_write_without_sync():
    with pytest.raises(SimError, match=r"shared-memory race: block 0, thread 0 reads s\[1\] "
                                       r"written by thread 1 since the last barrier"):
        run(neighbour_exchange(sync=False), IO(256), 4, 64, xin(256))


def test_smem_exchange_with_sync_passes():
    x = xin(256)
    out = run(neighbour_exchange(sync=True), IO(256), 4, 64, x)["out"]
    np.testing.assert_array_equal(out, np.roll(x["x"].reshape(4, 64), -1, axis=1).reshape(-1))


def test_smem_own_write_then_read_is_fine():
    body = [Smem("s", "f32", 64), B.global_index(64), Let("t", "i64", ThreadIdx()),
            Store("s", t, Load("x", i, "f32")), Store("out", i, Load("s", t, "f32"))]
    x = xin(128)
    np.testing.assert_array_equal(run(body, IO(128), 2, 64, x)["out"], x["x"])


def test_smem_two_threads_store_one_element_at_once():
    body = [Smem("s", "f32", 64), Let("t", "i64", ThreadIdx()), Store("s", E.floordiv(t, 32), B.F(1.0))]
    with pytest.raises(SimError, match=r"thread (0|31) and thread (0|31) write s\[0\] at once"):
        run(body, IO(64), 1, 64, xin(64))


def test_smem_two_writers_between_barriers():
    # t writes s[t], then t writes s[(t + 1) % 64]: thread 0's second store hits s[1] of thread 1
    body = [Smem("s", "f32", 64), Let("t", "i64", ThreadIdx()), Store("s", t, B.F(1.0)),
            Store("s", E.mod(E.add(t, 1), 64), B.F(2.0))]
    with pytest.raises(SimError, match=r"shared-memory race: block 0, thread 0 writes s\[1\] "
                                       r"also written by thread 1"):
        run(body, IO(64), 1, 64, xin(64))


def test_seed_rms_norm_tree_guarded_by_warp_is_a_write_race():
    """The seed listing's `if (warp < s) acc0_smem[warp] = ...` has 32 lanes write one element."""
    x = RNG.standard_normal((1, 32, 2048)).astype(np.float32)
    w = RNG.standard_normal(2048).astype(np.float32)
    # all 32 lanes of warp 0 read acc0_smem[0] and then write it: caught at thread 0's write
    with pytest.raises(SimError, match=r"shared-memory race: block 0, thread 0 writes acc0_smem\[0\]"):
        simulate(B.rms_norm(tree_guard="warp"), {"x": x, "p_weight": w})


def test_two_threads_write_one_global_element():
    n = 256
    body = [B.global_index(128), Store("out", E.floordiv(i, 2), Load("x", i, "f32"))]
    with pytest.raises(SimError, match=r"global race: block 0, thread [01] and block 0, thread [01] "
                                       r"both write out\[0\]"):
        run(body, IO(n), 2, 128, xin(n))


def test_global_write_race_across_batches(monkeypatch):
    from strata.kernel_ir import sim
    monkeypatch.setattr(sim, "MAX_LANES", 128)
    n = 256
    body = [B.global_index(128), Store("out", E.mod(i, 128), B.F(1.0))]
    with pytest.raises(SimError, match=r"block 1, thread 0 and block 0, thread 0 both write out\[0\]"):
        run(body, IO(n), 2, 128, xin(n))


def test_same_thread_writing_twice_is_fine():
    body = [B.global_index(64), Store("out", i, B.F(1.0)), Store("out", i, Load("out", i, "f32"))]
    assert (run(body, IO(64), 1, 64, xin(64))["out"] == 1).all()


def test_reading_another_threads_global_write():
    body = [B.global_index(64), Store("out", i, B.F(1.0)),
            Let("v", "f32", Load("out", E.mod(E.add(i, 1), 64), "f32"))]
    with pytest.raises(SimError, match=r"global race: block 0, thread 0 reads out\[1\] written"):
        run(body, IO(64), 1, 64, xin(64))


def test_divergent_sync():
    body = [Let("t", "i64", ThreadIdx()), If(E.call("lt", t, B.I(64)), (Sync(),))]
    with pytest.raises(SimError, match=r"divergent barrier: in block 0 only 64 of 128 threads "
                                       r"reach Sync \(thread 0 does, thread 64 does not\)"):
        run(body, IO(128), 2, 128, xin(128))


def test_block_uniform_sync_is_fine():
    """A barrier under a condition that is the same for the whole block is legal."""
    body = [B.global_index(64), Smem("s", "f32", 64), Let("t", "i64", ThreadIdx()),
            If(E.call("lt", BlockIdx(), B.I(2)), (
                Store("s", t, B.F(1.0)), Sync(), Store("out", i, Load("s", E.sub(63, t), "f32")))),
            If(E.call("ge", BlockIdx(), B.I(2)), (Store("out", i, B.F(2.0)),))]
    out = run(body, IO(256), 4, 64, xin(256))["out"]
    assert (out[:128] == 1).all() and (out[128:] == 2).all()


def test_sync_in_loop_with_per_thread_trip_count_is_divergent():
    body = [Let("t", "i64", ThreadIdx()), For("k", B.I(0), E.floordiv(t, 32), 1, (Sync(),))]
    with pytest.raises(SimError, match="divergent barrier"):
        run(body, IO(64), 1, 64, xin(64))


def vec_body(offset):
    return [B.global_index(32), LoadVec(("a", "b", "c", "d"), "x", E.add(E.mul(i, 4), offset), "f32"),
            StoreVec("out", E.mul(i, 4), tuple(B.V(v, "f32") for v in "abcd"))]


def test_misaligned_vector_load():
    with pytest.raises(SimError, match=r"misaligned vector load of 4 elements at x\[2\] "
                                       r"\(index not a multiple of 4\) by block 0, thread 0"):
        run(vec_body(2), IO(128), 1, 32, xin(128))


def test_out_of_bounds_vector_load():
    with pytest.raises(SimError, match=r"out-of-bounds vector load of x\[128:132\] "
                                       r"\(size 128\) by block 0, thread 31"):
        run(vec_body(4), IO(128), 1, 32, xin(128))


def test_misaligned_vector_store():
    body = [B.global_index(32), StoreVec("out", E.add(E.mul(i, 2), 1), (B.F(1), B.F(2)))]
    with pytest.raises(SimError, match=r"misaligned vector store of 2 elements at out\[1\]"):
        run(body, IO(128), 1, 32, xin(128))


def test_aligned_vector_access_passes():
    x = xin(128)
    np.testing.assert_array_equal(run(vec_body(0), IO(128), 1, 32, x)["out"], x["x"])


def test_shuffle_with_inactive_lanes():
    body = [Let("t", "i64", ThreadIdx()), Let("v", "f32", B.F(1.0)),
            If(E.call("lt", t, B.I(16)), (Let("w", "f32", ShflXor(B.V("v", "f32"), 16, "f32")),))]
    with pytest.raises(SimError, match=r"warp shuffle with inactive lanes: block 0, thread 16 "
                                       r"is not active while 16 lanes"):
        run(body, IO(64), 1, 64, xin(64))


def test_shuffle_needs_whole_warps():
    body = [Let("v", "f32", B.F(1.0)), Let("w", "f32", ShflXor(B.V("v", "f32"), 1, "f32"))]
    with pytest.raises(SimError, match="block of 48 threads"):
        run(body, IO(48), 1, 48, xin(48))


def test_shuffle_under_warp_uniform_branch_passes():
    body = [B.global_index(64), Let("t", "i64", ThreadIdx()), Let("v", "f32", Load("x", i, "f32")),
            If(E.call("ge", t, B.I(32)), (
                Store("out", i, ShflXor(B.V("v", "f32"), 1, "f32")),)),
            If(E.call("lt", t, B.I(32)), (Store("out", i, B.V("v", "f32")),))]
    x = xin(64)["x"]
    out = run(body, IO(64), 1, 64, {"x": x})["out"]
    np.testing.assert_array_equal(out[:32], x[:32])
    np.testing.assert_array_equal(out[32:], x[32:].reshape(-1, 2)[:, ::-1].reshape(-1))


def test_smem_write_after_another_threads_read():
    """An in-place tree step without a barrier between the read and the write of a neighbour."""
    body = [Smem("s", "f32", 64), Let("t", "i64", ThreadIdx()), Store("s", t, B.F(1.0)), Sync(),
            Let("v", "f32", Load("s", E.mod(E.add(t, 1), 64), "f32")),
            Store("s", t, B.V("v", "f32"))]
    with pytest.raises(SimError, match=r"shared-memory race: block 0, thread 0 writes s\[0\] read by "
                                       r"thread 63 since the last barrier"):
        run(body, IO(64), 1, 64, xin(64))


def test_smem_write_after_broadcast_read():
    body = [Smem("s", "f32", 64), Let("t", "i64", ThreadIdx()), Store("s", t, B.F(1.0)), Sync(),
            Let("v", "f32", Load("s", B.I(0), "f32")),
            If(E.call("eq", t, B.I(0)), (Store("s", B.I(0), B.F(2.0)),))]
    with pytest.raises(SimError, match=r"thread 0 writes s\[0\] read by other threads"):
        run(body, IO(64), 1, 64, xin(64))


def test_smem_read_then_write_with_sync_between_passes():
    body = [Smem("s", "f32", 64), B.global_index(64), Let("t", "i64", ThreadIdx()),
            Store("s", t, Load("x", i, "f32")), Sync(),
            Let("v", "f32", Load("s", E.mod(E.add(t, 1), 64), "f32")), Sync(),
            Store("s", t, B.V("v", "f32")), Sync(),
            Store("out", i, Load("s", t, "f32"))]
    x = xin(128)
    out = run(body, IO(128), 2, 64, x)["out"]
    np.testing.assert_array_equal(out, np.roll(x["x"].reshape(2, 64), -1, axis=1).reshape(-1))
