"""TMA, mbarrier and wgmma statements become inline PTX that NVRTC and ptxas accept for sm_90a
(cubins, so the PTX inside the asm strings is assembled too), with the tensor map as a
__grid_constant__ parameter; they are refused for targets that lack them."""
import sys
from pathlib import Path

import pytest

from strata.core.errors import CompileError
from strata.codegen.cuda import emit_kernel, emit_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import wgmma_builders as W
from strata.kernel_ir.verify import verify_program

PROGRAMS = {
    "wgmma_64x64x16": lambda: W.wgmma_gemm(64, 64, 16),
    "wgmma_64x256x64": lambda: W.wgmma_gemm(64, 256, 64, 256),
    "wgmma_pipeline_50x64x80": lambda: W.wgmma_gemm(50, 64, 80),
    "tma_probe_try_wait": lambda: W.tma_probe(30, 40, 16, 24, (-8, 20), "none", try_wait=True),
    "bf16_4096_cubed": lambda: W.wgmma_gemm(4096, 4096, 4096, 64, stages=2),
}


def test_inline_ptx():
    src = emit_kernel(W.wgmma_gemm(64, 64, 192).kernels[0])
    for text in ("const __grid_constant__ st_tensor_map A, const __grid_constant__ st_tensor_map B",
                 "__shared__ __align__(1024) __nv_bfloat16 a_s[8192];",
                 '"mbarrier.init.shared::cta.b64 [%0], %1;"',
                 '"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"',
                 "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
                 '"l"(reinterpret_cast<unsigned long long>(&A))',
                 "st_mbar_wait(st_smem_addr(&bar[s]), (unsigned)(kt / 2 % 2));",
                 'asm volatile("wgmma.fence.sync.aligned;" ::: "memory");',
                 "long long da = st_wgmma_desc(&a_s[s * 4096], 16, 1024, 1);",
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16",
                 '%32, %33, p, 1, 1, 0, 0; }"',
                 ': "l"(da + 2), "l"(db + 2), "r"((int)1)',
                 'asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");',
                 'asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");',
                 'asm volatile("fence.proxy.async.shared::cta;" ::: "memory");'):
        assert text in src, text


def test_refused_without_sm90a():
    prog = W.wgmma_gemm()
    with pytest.raises(CompileError, match="k_wgmma_64x64x64 uses wgmma, which needs sm_90a, "
                                           "not sm_90"):
        emit_program(prog, "sm_90")
    with pytest.raises(CompileError, match="TMA, mbarrier or wgmma, which need sm_90 or newer, "
                                           "not sm_80"):
        emit_program(W.tma_probe(16, 64, 16, 64, (0, 0), "128B"), "sm_80")
    assert "st_mbar_wait" in emit_program(W.tma_probe(16, 64, 16, 64, (0, 0), "128B"), "sm_90")


nvrtc = pytest.importorskip("strata.runtime.nvrtc")
pytest.importorskip("cuda.bindings.nvrtc")


@pytest.fixture(scope="module")
def headers():
    if not nvrtc.include_dirs():
        pytest.skip("no CUDA headers (cuda_fp16.h) found")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_compiles_for_sm90a(name, headers):
    prog = PROGRAMS[name]()
    verify_program(prog)
    src = emit_program(prog, "sm_90a")
    assert nvrtc.compile_cuda(src, "sm_90a")[:4] == b"\x7fELF"
    ptx = nvrtc.compile_cuda(src, "sm_90a", want="ptx").decode()
    assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.try_wait.parity" in ptx
    assert ("wgmma.mma_async.sync.aligned.m64n" in ptx) == name.startswith(("wgmma", "bf16"))


def test_guard_stops_plain_sm90(headers):
    src = emit_program(W.wgmma_gemm(), "sm_90a")
    with pytest.raises(CompileError, match="needs sm_90a"):
        nvrtc.compile_cuda(src, "sm_90")
