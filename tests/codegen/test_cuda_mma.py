"""Tensor-core and cp.async statements become inline PTX that ptxas accepts for sm_80 and sm_90
(cubins, so the PTX inside the asm strings is assembled too), and are refused below sm_80."""
import sys
from pathlib import Path

import pytest

from strata.core.errors import CompileError
from strata.kernel_ir.ir import Kernel, Let, Mma
from strata.codegen.cuda import TENSOR_CORE_PRELUDE, emit_kernel, emit_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import kernel_builders as B  # noqa: E402
import mma_builders as MB  # noqa: E402

PROGRAMS = {
    "mma_16x8_f16": lambda: MB.mma_16x8("f16"),
    "mma_13x8_bf16": lambda: MB.mma_16x8("bf16", 13),
    "mma_tiled_f16": lambda: MB.mma_tiled(dtype="f16"),
    "mma_tiled_bf16": lambda: MB.mma_tiled(128, 128, 64, "bf16"),
    "ldmatrix_x1": lambda: MB.ldmatrix_probe(1, False),
    "ldmatrix_x2_trans": lambda: MB.ldmatrix_probe(2, True),
    "ldmatrix_x4": lambda: MB.ldmatrix_probe(4, False),
}


def test_inline_ptx():
    src = emit_kernel(MB.mma_16x8("bf16", 13).kernels[0])
    for text in ('asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"',
                 '"r"((unsigned)(lane / 2 < 13 ? 16 : 0))',
                 'asm volatile("cp.async.ca.shared.global [%0], [%1], 16;"',
                 '"r"(st_smem_addr(&b_s[lane * 8])), "l"(&B[lane * 8])',
                 'asm volatile("cp.async.commit_group;" ::: "memory");',
                 'asm volatile("cp.async.wait_group 0;" ::: "memory");',
                 "__shared__ __align__(16) __nv_bfloat16 a_s[256];",
                 "int a0, a1, a2, a3;",
                 '"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"',
                 '"ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"',
                 ': "=r"(b0), "=r"(b1)',
                 '"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "\n',
                 '"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"\n',
                 ': "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)\n',
                 ': "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));'):
        assert text in src, text


def test_separate_accumulators_are_inputs():
    a, b, c, d = MB.regs("a", 4), MB.regs("b", 2), MB.regs("c", 4), MB.regs("d", 4)
    body = (*(Let(v, "i32", B.I(0)) for v in a + b), *(Let(v, "f32", B.F(1.0)) for v in c + d),
            Mma(d, a, b, c, "f16"))
    src = emit_kernel(Kernel("k_mma", (), 1, 32, body))
    assert "{%10, %11, %12, %13};" in src and ': "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)' in src
    assert '"r"(b1), "f"(c0), "f"(c1),\n' in src and '"f"(c2), "f"(c3));' in src


def test_prelude_only_where_used_and_refused_below_sm80():
    assert "st_smem_addr" not in emit_program(B.elementwise(100))
    assert TENSOR_CORE_PRELUDE.strip() in emit_program(MB.mma_16x8("f16"), "sm_80")
    with pytest.raises(CompileError, match="k_mma_16x8_f16 uses mma.sync, ldmatrix or cp.async, "
                                           "which need sm_80 or newer, not sm_75"):
        emit_program(MB.mma_16x8("f16"), "sm_75")


nvrtc = pytest.importorskip("strata.runtime.nvrtc")
pytest.importorskip("cuda.bindings.nvrtc")


@pytest.fixture(scope="module")
def headers():
    if not nvrtc.include_dirs():
        pytest.skip("no CUDA headers (cuda_fp16.h) found")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiles(name, arch, headers):
    src = emit_program(PROGRAMS[name](), arch)
    assert nvrtc.compile_cuda(src, arch)[:4] == b"\x7fELF"
    ptx = nvrtc.compile_cuda(src, arch, want="ptx").decode()
    assert ("mma.sync.aligned.m16n8k16" in ptx) == name.startswith("mma")
    assert "ldmatrix.sync.aligned.m8n8" in ptx


def test_guard_stops_an_older_architecture(headers):
    with pytest.raises(CompileError, match="need sm_80 or newer"):
        nvrtc.compile_cuda(emit_program(MB.mma_16x8("f16"), "sm_80"), "sm_75")
