"""The sanitizer on tensor-core and cp.async kernels: reading a cp.async destination before its
wait_group (or, from another thread, before the Sync after it), refilling a buffer still being
read, misaligned or out-of-bounds copies and ldmatrix rows, and warp-collective ops with inactive
lanes all raise SimError; the corrected kernels run clean."""
import numpy as np
import pytest

from strata.core import expr as E
from strata.core.errors import SimError
from strata.kernel_ir.ir import (Buffer, CpAsync, CpAsyncCommit, CpAsyncWait, For, If, Kernel, LdMatrix,
                              Let, Load, Mma, Param, Smem, Store, Sync, ThreadIdx)
from strata.kernel_ir.sim import simulate

import kernel_builders as B
import mma_builders as MB

RNG = np.random.default_rng(5)
t = B.V("t", "i32")
F32 = lambda n: B.V(n, "f32")  # noqa: E731


def halves(*shape):
    return RNG.standard_normal(shape).astype(np.float16)


def mma_inputs():
    return {"A": halves(16, 16), "B": halves(16, 8)}


def drop(kind, nth=None):
    """A rewrite that removes statements of `kind` (only the nth of them, counting from 0)."""
    seen = []

    def fn(s):
        if isinstance(s, kind):
            seen.append(s)
            if nth is None or len(seen) - 1 == nth:
                return None
        return s
    return fn


def test_read_before_wait_group():
    prog = MB.rewrite(MB.mma_16x8("f16"), drop(CpAsyncWait))
    with pytest.raises(SimError, match=r"reads a_s\[\d+\] before the cp.async that writes it has "
                                       r"landed \(missing cp.async.wait_group\)"):
        simulate(prog, mma_inputs())


def test_other_threads_read_after_wait_without_sync():
    prog = MB.rewrite(MB.mma_16x8("f16"), drop(Sync))
    with pytest.raises(SimError, match=r"shared-memory race: block 0, thread \d+ reads a_s\[\d+\] "
                                       r"written by thread \d+ since the last barrier"):
        simulate(prog, mma_inputs())


def test_tiled_wait_group_too_loose():
    """wait_group 2 in the double-buffered loop leaves the current slab in flight."""
    prog = MB.rewrite(MB.mma_tiled(), lambda s: CpAsyncWait(2) if isinstance(s, CpAsyncWait) else s)
    with pytest.raises(SimError, match="before the cp.async that writes it has landed"):
        simulate(prog, {"A": halves(64, 128), "B": halves(128, 64)})


def test_tiled_refill_without_sync_races_with_readers():
    """Without the Sync that ends each K step, the next slab's cp.async overwrites a stage that
    other warps may still be reading with ldmatrix."""
    prog = MB.rewrite(MB.mma_tiled(), drop(Sync, nth=1))
    with pytest.raises(SimError, match=r"shared-memory race: block 0, thread \d+ writes a_s\[\d+\] "
                                       r"read by (other threads|thread \d+) since the last barrier"):
        simulate(prog, {"A": halves(64, 128), "B": halves(128, 64)})


def copies(*stmts, n=256, block=32):
    """A one-block kernel around `stmts`: x (global f32[n]) -> s (shared f32[128]) -> out."""
    body = (Let("t", "i32", ThreadIdx()), Smem("s", "f32", 128), *stmts)
    params = (Param("x", "f32", n), Param("out", "f32", 4 * block, output=True))
    k = Kernel("k_copy", params, 1, block, body)
    return B.program(k, [Buffer("x", "f32", (n,), "input"), Buffer("out", "f32", (4 * block,), "output")])


def cp(dst, src, **kw):
    return CpAsync("s", dst, "x", src, 16, **kw)


def store_own(base=0):
    """out[4t + j] = s[base + 4t + j]: each thread reads what it copied itself."""
    return tuple(Store("out", E.add(E.mul(t, 4), j), Load("s", E.add(E.mul(t, 4), base + j), "f32"))
                 for j in range(4))


def test_wait_group_completes_all_but_the_newest_groups():
    x = RNG.standard_normal(256).astype(np.float32)
    four_t = E.mul(t, 4)
    groups = (cp(four_t, four_t), CpAsyncCommit(), cp(E.add(four_t, 64), E.add(four_t, 64)),
              CpAsyncCommit(), CpAsyncWait(1))
    out = simulate(copies(*groups, *store_own(), block=16), {"x": x})["out"]
    np.testing.assert_array_equal(out, x[:64])          # group 0 landed; own copies need no Sync
    with pytest.raises(SimError, match=r"thread 0 reads s\[64\] before the cp.async"):
        simulate(copies(*groups, *store_own(64), block=16), {"x": x})


def test_uncommitted_copies_are_not_waited_for():
    x = RNG.standard_normal(256).astype(np.float32)
    four_t = E.mul(t, 4)
    with pytest.raises(SimError, match="before the cp.async that writes it has landed"):
        simulate(copies(cp(four_t, four_t), CpAsyncWait(0), *store_own(), block=16), {"x": x})
    out = simulate(copies(cp(four_t, four_t), CpAsyncCommit(), CpAsyncWait(0), *store_own(),
                          block=16), {"x": x})["out"]
    np.testing.assert_array_equal(out, x[:64])


def test_zero_fill_reads_only_src_bytes():
    """Thread t copies x[4t..] with src_bytes = 16, 8, 4, 0 by t % 4; nothing past x's end is
    read, the rest of each 16 bytes is zero."""
    x = RNG.standard_normal(64).astype(np.float32)
    four_t = E.mul(t, 4)
    nbytes = E.sub(B.I(16), E.mul(E.mod(t, 4), 4))
    prog = copies(cp(four_t, E.call("minimum", four_t, B.I(60)), src_bytes=nbytes), CpAsyncCommit(),
                  CpAsyncWait(0), *store_own(), n=64, block=32)
    out = simulate(prog, {"x": x})["out"].reshape(32, 4)
    src = np.minimum(np.arange(32) * 4, 60)
    for tid in range(32):
        keep = 4 - tid % 4
        np.testing.assert_array_equal(out[tid, :keep], x[src[tid]:src[tid] + keep])
        assert (out[tid, keep:] == 0).all()


@pytest.mark.parametrize("stmt,msg", [
    (cp(E.add(E.mul(t, 4), 2), E.mul(t, 4)), r"misaligned vector cp.async of 4 elements at s\[2\]"),
    (cp(E.mul(t, 4), E.add(E.mul(t, 4), 1)), r"misaligned vector cp.async of 4 elements at x\[1\]"),
    (cp(E.mul(t, 4), E.add(E.mul(t, 4), 132)), r"out-of-bounds cp.async read of x\[256\] "
                                                r"\(size 256\) by block 0, thread 31"),
    (cp(E.mul(t, 4), E.mul(t, 4), src_bytes=B.I(6)), r"src_bytes 6 is not whole f32 elements"),
    (cp(B.I(0), E.mul(t, 4)), r"thread 1 and another thread both copy to s\[0\]"),
])
def test_bad_copies(stmt, msg):
    with pytest.raises(SimError, match=msg):
        simulate(copies(stmt), {"x": RNG.standard_normal(256).astype(np.float32)})


def test_write_to_a_destination_in_flight():
    four_t = E.mul(t, 4)
    with pytest.raises(SimError, match=r"writes s\[0\] while a cp.async to it is in flight"):
        simulate(copies(cp(four_t, four_t), Store("s", four_t, B.F(1.0))),
                 {"x": RNG.standard_normal(256).astype(np.float32)})
    with pytest.raises(SimError, match=r"writes s\[0\] while a cp.async to it is in flight"):
        simulate(copies(cp(four_t, four_t), cp(four_t, four_t)),
                 {"x": RNG.standard_normal(256).astype(np.float32)})


def warp_kernel(*stmts, block=64):
    """One block with h (shared f16[512]) set to ones and synced, fragment registers a*/b* = 0
    and accumulators c* = 0 declared, then `stmts`."""
    body = (Let("t", "i32", ThreadIdx()), Smem("h", "f16", 512),
            For("f", t, B.I(512), block, (Store("h", B.V("f", "i32"), B.F(1.0)),)), Sync(),
            *(Let(f"a{r}", "i32", B.I(0)) for r in range(4)),
            *(Let(f"b{r}", "i32", B.I(0)) for r in range(2)),
            *(Let(f"c{r}", "f32", B.F(0.0)) for r in range(4)), *stmts)
    k = Kernel("k_warp", (Param("out", "f32", 1, output=True),), 1, block, body)
    return B.program(k, [Buffer("out", "f32", (1,), "output")])


MMA = Mma(MB.regs("c", 4), MB.regs("a", 4), MB.regs("b", 2), MB.regs("c", 4), "f16")
ROW = E.mul(E.mod(t, 32), 8)


@pytest.mark.parametrize("stmts,msg", [
    ((If(E.call("lt", t, B.I(48)), (MMA,)),),
     r"mma with inactive lanes: block 0, thread 48 is not active while 16 lanes of its warp"),
    ((If(E.call("ge", t, B.I(8)), (LdMatrix(("r",), "h", ROW),)),),
     r"ldmatrix with inactive lanes: block 0, thread 0 is not active while 24 lanes"),
    ((LdMatrix(("r0", "r1"), "h", E.add(ROW, 4)),),
     r"ldmatrix row h\[4\] is not 16-byte aligned .* by block 0, thread 0"),
    ((LdMatrix(("r0", "r1", "r2", "r3"), "h", E.add(ROW, 264)),),
     r"out-of-bounds ldmatrix row h\[512:520\] \(size 512\) by block 0, thread 31"),
])
def test_bad_warp_ops(stmts, msg):
    with pytest.raises(SimError, match=msg):
        simulate(warp_kernel(*stmts), {})


def test_warp_ops_need_whole_warps():
    with pytest.raises(SimError, match="mma in a block of 48 threads"):
        simulate(warp_kernel(MMA, block=48), {})


def test_warp_ops_under_warp_uniform_branch_pass():
    out = simulate(warp_kernel(If(E.call("ge", t, B.I(32)), (
        LdMatrix(MB.regs("a", 4), "h", ROW), LdMatrix(MB.regs("b", 2), "h", ROW, trans=True), MMA,
        If(E.call("eq", t, B.I(32)), (Store("out", B.I(0), F32("c0")),)))),), {})["out"]
    assert out[0] == 16.0           # a row of ones times a column of ones
