"""verify() on tensor-core and cp.async statements: the shapes, types and buffers PTX accepts."""
import pytest

from strata.core import expr as E
from strata.kernel_ir.ir import (CpAsync, CpAsyncWait, Kernel, LdMatrix, Let, Mma,
                              Param, Smem, ThreadIdx)

import kernel_builders as B
import mma_builders as MB
from strata.kernel_ir.verify import KernelVerifyError, verify_program, verify_kernel

t = B.V("t", "i32")


def kernel(*stmts):
    body = (Let("t", "i32", ThreadIdx()), Smem("h", "f16", 256), Smem("f", "f32", 256),
            *(Let(f"a{r}", "i32", B.I(0)) for r in range(4)),
            *(Let(f"b{r}", "i32", B.I(0)) for r in range(2)),
            *(Let(f"c{r}", "f32", B.F(0.0)) for r in range(4)), *stmts)
    params = (Param("x", "f16", 256), Param("y", "f32", 256), Param("out", "f16", 256, output=True))
    return Kernel("k", params, 1, 32, body)


A, Bs, C = MB.regs("a", 4), MB.regs("b", 2), MB.regs("c", 4)
ROW = E.mul(t, 8)


def test_good_statements_pass():
    verify_kernel(kernel(LdMatrix(MB.regs("r", 4), "h", ROW), LdMatrix(("s",), "h", ROW, trans=True),
                         Mma(C, A, Bs, C, "bf16"), CpAsync("h", ROW, "x", ROW, 16, cache="cg"),
                         CpAsync("f", t, "y", t, 4, src_bytes=E.call("where", E.call("lt", t, B.I(3)),
                                                                        B.I(4), B.I(0)))))
    for prog in (MB.mma_16x8("bf16", 13), MB.mma_tiled()):
        verify_program(prog)


@pytest.mark.parametrize("stmt,msg", [
    (LdMatrix(MB.regs("r", 3), "h", ROW), "ldmatrix loads 1, 2 or 4 matrices, not 3"),
    (LdMatrix(("r",), "f", ROW), "ldmatrix reads a shared array of 16-bit elements, not f"),
    (LdMatrix(("r",), "h", B.V("nowhere", "i32")), r"ldmatrix from h uses undefined \['nowhere'\]"),
    (Mma(C, A, Bs, C, "f32"), "mma m16n8k16 takes f16 or bf16 inputs, not f32"),
    (Mma(C, A[:3], Bs, C, "f16"), "takes 4 A registers, 2 B registers"),
    (Mma(C, ("c0", "a1", "a2", "a3"), Bs, C, "f16"), "mma operand c0 is not an i32 fragment register"),
    (Mma(("a0", "c1", "c2", "c3"), A, Bs, C, "f16"), "mma accumulator a0 is not f32"),
    (Mma(C, A, ("b0", "b9"), C, "f16"), r"mma uses undefined \['b9'\]"),
    (CpAsync("h", ROW, "y", ROW, 16), "cp.async y -> h changes the dtype"),
    (CpAsync("x", ROW, "h", ROW, 16), "copies a global parameter to a shared array, not h -> x"),
    (CpAsync("h", t, "x", t, 2), "cp.async copies 4, 8 or 16 bytes of whole elements, not 2"),
    (CpAsync("h", ROW, "x", ROW, 8, cache="cg"), r"cp.async.cg of 8 bytes \(cg copies 16 bytes only\)"),
    (CpAsyncWait(-1), "cp.async.wait_group -1"),
])
def test_bad_statements(stmt, msg):
    with pytest.raises(KernelVerifyError, match=msg):
        verify_kernel(kernel(stmt))
