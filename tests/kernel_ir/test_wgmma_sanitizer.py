"""The simulator as a sanitizer for TMA, mbarrier and wgmma: each test breaks a working kernel in one
place (a missing wait, fence or Sync, a wrong parity, a partial warpgroup) and expects a SimError
naming the mistake; verify() rejects malformed statements."""
from dataclasses import replace

import numpy as np
import pytest
import wgmma_builders as W
from kernel_builders import I
from mma_builders import rewrite

from strata.core import dtypes
from strata.core import expr as E
from strata.core.errors import SimError
from strata.kernel_ir.ir import (
    For,
    If,
    Load,
    MbarWait,
    Store,
    Sync,
    ThreadIdx,
    TmaLoad,
    Wgmma,
    WgmmaFence,
    WgmmaWait,
)
from strata.kernel_ir.sim import simulate
from strata.kernel_ir.verify import KernelVerifyError, verify_program

RNG = np.random.default_rng(5)


def run(prog, m=64, n=64, k=64):
    a = dtypes.round_to(RNG.standard_normal((m, k)).astype(np.float32), "bf16")
    b = dtypes.round_to(RNG.standard_normal((n, k)).astype(np.float32), "bf16")
    return simulate(prog, {"A": a, "B": b})["C"]


def drop(kind):
    return lambda s: None if isinstance(s, kind) else s


def test_missing_mbarrier_wait():
    with pytest.raises(SimError, match="before waiting on the mbarrier phase.*missing mbarrier wait"):
        run(rewrite(W.wgmma_gemm(), drop(MbarWait)))


def test_wrong_phase_parity_never_completes():
    def flip(s):
        return replace(s, parity=E.sub(I(1), s.parity)) if isinstance(s, MbarWait) else s
    with pytest.raises(SimError, match="parity 1, which has not completed"):
        run(rewrite(W.wgmma_gemm(), flip))


def test_accumulators_read_before_wait_group():
    with pytest.raises(SimError, match="reads d0, an accumulator of a wgmma still in flight"):
        run(rewrite(W.wgmma_gemm(), drop(WgmmaWait)))


def test_refill_while_wgmma_reads_the_stage():
    prog = rewrite(W.wgmma_gemm(64, 64, 192), drop(WgmmaWait))
    with pytest.raises(SimError, match="while a wgmma that reads it is in flight"):
        run(prog, k=192)


def test_missing_wgmma_fence():
    with pytest.raises(SimError, match="missing wgmma.fence"):
        run(rewrite(W.wgmma_gemm(), drop(WgmmaFence)))


def test_missing_sync_before_tma_refill():
    def no_loop_sync(s):
        if isinstance(s, For):
            return replace(s, body=tuple(x for x in s.body if not isinstance(x, Sync)))
        return s
    prog = rewrite(W.wgmma_gemm(64, 64, 192), no_loop_sync)
    with pytest.raises(SimError, match="block 0, thread 0 writes a_s.*read by thread 1 since "
                                       "the last barrier"):
        run(prog, k=192)


def test_partial_warpgroup():
    def half(s):
        return If(E.call("lt", ThreadIdx(), I(64)), (s,)) if isinstance(s, Wgmma) else s
    with pytest.raises(SimError, match="wgmma with inactive threads"):
        run(rewrite(W.wgmma_gemm(), half))


def test_try_wait_on_an_incomplete_phase_sees_nothing():
    x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) % 13
    ok = simulate(W.tma_probe(64, 64, 64, 64, (0, 0), "128B", try_wait=True), {"X": x})
    assert ok["flag"][0] == 1
    incomplete = W.tma_probe(64, 64, 64, 64, (0, 0), "128B", extra_tx=16, try_wait=True, read=False)
    assert simulate(incomplete, {"X": x})["flag"][0] == 0
    with pytest.raises(SimError, match="missing mbarrier wait"):
        simulate(W.tma_probe(64, 64, 64, 64, (0, 0), "128B", extra_tx=16, try_wait=True), {"X": x})
    with pytest.raises(SimError, match="16 transaction bytes pending"):
        simulate(W.tma_probe(64, 64, 64, 64, (0, 0), "128B", extra_tx=16), {"X": x})


def test_barrier_used_before_the_sync_after_init():
    x = np.zeros((64, 64), np.float32)
    with pytest.raises(SimError, match="missing Sync after mbarrier.init"):
        simulate(rewrite(W.tma_probe(64, 64, 64, 64, (0, 0), "128B"), drop(Sync)), {"X": x})


def test_misaligned_tma_destination():
    x = np.zeros((64, 64), np.float32)
    prog = rewrite(W.tma_probe(16, 64, 8, 64, (0, 0), "128B"),
                   lambda s: replace(s, dst_index=I(8)) if isinstance(s, TmaLoad) else s)
    with pytest.raises(SimError, match=r"s\[8\] is not 128-byte aligned"):
        simulate(prog, {"X": x[:16]})


def test_verify_rejects_malformed_hopper_statements():
    prog = W.wgmma_gemm()
    k = prog.kernels[0]
    bad_n = rewrite(prog, lambda s: replace(s, n=60) if isinstance(s, Wgmma) else s)
    with pytest.raises(KernelVerifyError, match="N a multiple of 8"):
        verify_program(bad_n)
    few = rewrite(prog, lambda s: replace(s, d=s.d[:8]) if isinstance(s, Wgmma) else s)
    with pytest.raises(KernelVerifyError, match="takes 32 f32 accumulators"):
        verify_program(few)
    load_map = rewrite(prog, lambda s: Store("C", I(0), Load("A", I(0), "f32"))
                       if isinstance(s, WgmmaFence) else s)
    with pytest.raises(KernelVerifyError, match="A is an mbarrier or tensor map"):
        verify_program(load_map)
    wrong_block = type(prog)(prog.buffers, [replace(k, block=96)], prog.outputs)
    with pytest.raises(KernelVerifyError, match="whole warpgroups"):
        verify_program(wrong_block)
