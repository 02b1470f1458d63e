"""wgmma with A in registers (Wgmma.a_regs, the attention's P V and Q K^T): each warp's 16 rows
as mma.m16n8k16's A fragment. A hand-built 64 x 8 x 16 product on the simulator against numpy,
a wrong fragment order giving wrong numbers, the registers' fence and in-flight rules, verify()
and the CUDA text."""
import numpy as np
import pytest
from kernel_builders import I, V, program

from strata.codegen.cuda import emit_kernel
from strata.core import dtypes
from strata.core import expr as E
from strata.core.errors import SimError
from strata.kernel_ir.ir import (Assign, Buffer, FenceProxyAsync, Kernel, Let, Load, PackHalf2,
                                 Param, Smem, Store, Sync, ThreadIdx, Wgmma, WgmmaCommit,
                                 WgmmaDesc, WgmmaFence, WgmmaWait)
from strata.kernel_ir.sim import simulate
from strata.kernel_ir.verify import KernelVerifyError, verify_program

F32 = "f32"


def _kernel(order=(0, 1, 2, 3), fence=True, clobber=False, proxy_fence=True):
    """out (64 x 8) = A (64 x 16) @ B (8 x 16)^T: A's fragments packed from global loads, B in
    shared memory without swizzle (core matrices of 8 x 8: LBO 128 bytes between the two K
    halves)."""
    tid, w, g, t = (V(n, "i32") for n in ("tid", "w", "g", "t"))
    body = [Let("tid", "i32", ThreadIdx()), Let("w", "i32", E.floordiv(tid, 32)),
            Let("g", "i32", E.floordiv(E.mod(tid, 32), 4)), Let("t", "i32", E.mod(tid, 4)),
            Smem("b_s", "bf16", 128), Let("e", "i32", tid)]
    e = V("e", "i32")       # thread e < 128 stores B's element (e // 16, e % 16)
    r, k = E.floordiv(e, 16), E.mod(e, 16)
    body += [Store("b_s", E.add(E.add(E.mul(E.floordiv(k, 8), 64), E.mul(r, 8)), E.mod(k, 8)),
                   Load("B", e, F32))]
    body += [FenceProxyAsync()] if proxy_fence else []      # the store, seen by wgmma's proxy
    body.append(Sync())
    d = tuple(f"d{i}" for i in range(4))
    body += [Let(v, F32, E.Const(0.0, F32)) for v in d] + [WgmmaFence()]
    for reg in range(4):            # a_reg: rows g + 8 (reg & 1), cols 2t + 8 (reg >> 1), +1
        row = E.add(E.add(E.mul(w, 16), g), 8 * (reg & 1))
        col = E.add(E.mul(t, 2), 8 * (reg >> 1))
        at = E.add(E.mul(row, 16), col)
        body.append(PackHalf2(f"a{order[reg]}", Load("A", at, F32), Load("A", E.add(at, 1), F32), "bf16"))
    body += [WgmmaFence()] if fence else []     # the packs wrote A's registers
    body += [Wgmma(d, None, WgmmaDesc("b_s", I(0), 128, 256, "none"), 8, "bf16",
                   a_regs=tuple(f"a{i}" for i in range(4))), WgmmaCommit()]
    body += [Assign("a0", I(0))] if clobber else []
    body.append(WgmmaWait(0))
    for i, v in enumerate(d):       # d[i]: row 16 w + g + 8 (i // 2 % 2), col 2t + i % 2
        row = E.add(E.add(E.mul(w, 16), g), 8 * (i // 2 % 2))
        body.append(Store("out", E.add(E.mul(row, 8), E.add(E.mul(t, 2), i % 2)), V(v, F32)))
    params = (Param("A", "bf16", 64 * 16), Param("B", "bf16", 8 * 16), Param("out", F32, 64 * 8, True))
    kern = Kernel("k_wgmma_reg_a", params, 1, 128, tuple(body))
    return program(kern, [Buffer("A", "bf16", (64, 16), "input"), Buffer("B", "bf16", (8, 16), "input"),
                          Buffer("out", F32, (64, 8), "output")])


def _run(prog):
    rng = np.random.default_rng(3)
    a = dtypes.round_to(rng.standard_normal((64, 16)).astype(np.float32), "bf16")
    b = dtypes.round_to(rng.standard_normal((8, 16)).astype(np.float32), "bf16")
    return simulate(prog, {"A": a, "B": b})["out"], a @ b.T


def test_register_a_matches_numpy():
    verify_program(_kernel())
    out, ref = _run(_kernel())
    assert np.abs(np.asarray(out) - ref).max() < 1e-4


def test_a_wrong_fragment_order_gives_wrong_numbers():
    out, ref = _run(_kernel(order=(1, 0, 2, 3)))
    assert np.abs(np.asarray(out) - ref).max() > 0.1


def test_registers_written_without_a_fence_fail():
    with pytest.raises(SimError, match="A register a. was written .* since its last wgmma.fence"):
        _run(_kernel(fence=False))


def test_a_register_written_while_in_flight_fails():
    with pytest.raises(SimError, match="writes a0, an A register of a wgmma still in flight"):
        _run(_kernel(clobber=True))


def test_shared_memory_stored_without_a_proxy_fence_fails():
    """B stored by ordinary stores and read by wgmma (the async proxy) with no fence.proxy.async
    in between: PTX leaves the read undefined, the simulator stops."""
    with pytest.raises(SimError, match="missing fence.proxy.async"):
        _run(_kernel(proxy_fence=False))


def test_verify_and_cuda_text():
    from dataclasses import replace
    prog = _kernel()
    kern = prog.kernels[0]
    bad = replace(kern, body=tuple(replace(s, a=I(0)) if isinstance(s, Wgmma) else s
                                   for s in kern.body))
    with pytest.raises(KernelVerifyError, match="by a descriptor or by registers"):
        verify_program(replace(prog, kernels=[bad]))
    text = emit_kernel(kern)
    assert '"{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0; }"' in text    # no trans-a
    assert '"r"(a0), "r"(a1), "r"(a2), "r"(a3)' in text and '"+r"(a3)' in text
