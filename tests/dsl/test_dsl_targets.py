"""HIP and Metal sources of every example: HIP compiles through a HIP-on-CUDA header with NVRTC
(what HIP itself does on NVIDIA GPUs) and with hipcc where ROCm is installed (not here), Metal is
emitted with its frame (`xcrun metal` compiles it where it exists); NVIDIA-only statements are
refused by name."""
import pathlib
import re
import shutil

import pytest

from strata.core.errors import CompileError
from strata.kernel_ir.ir import CpAsyncCommit, Kernel, Param, Sync
from strata.codegen import hip, metal, opencl
from test_dsl_examples import EXAMPLES, launched_kernels

HIP_ON_CUDA = r"""#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef __nv_bfloat16 __hip_bfloat16;
template <typename T> __device__ T __shfl_xor(T v, int m, int w) { return __shfl_xor_sync(0xffffffffu, v, m, w); }
template <typename T> __device__ T __shfl(T v, int l, int w) { return __shfl_sync(0xffffffffu, v, l, w); }"""


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_hip_source_compiles_as_hip_on_cuda(path):
    pytest.importorskip("cuda.bindings.nvrtc")
    from strata.runtime.nvrtc import compile_cuda
    for k in launched_kernels(path):
        source = k.source("hip")
        assert hip.HEADER in source and "__nv_bfloat16" not in source and "_sync(" not in source
        assert len(compile_cuda(source.replace(hip.HEADER, HIP_ON_CUDA), "sm_80")) > 0
        if shutil.which("hipcc"):                  # ROCm: compile it for real
            import subprocess
            import tempfile
            with tempfile.TemporaryDirectory() as d:
                (pathlib.Path(d) / "k.hip").write_text(source)
                subprocess.run(["hipcc", "--genco", "-o", f"{d}/k.co", f"{d}/k.hip"], check=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_metal_source_has_its_frame(path, tmp_path):
    for k in launched_kernels(path):
        check_metal(k, tmp_path)


def check_metal(k, tmp_path):
    source = k.source("metal")
    ir = k.kernel_ir()
    assert source.startswith("// strata: 1 kernel(s) for Metal") and "#include <metal_stdlib>" in source
    signature = source[source.index("kernel void"):source.index(") {", source.index("kernel void"))]
    assert len(re.findall(r"\[\[buffer\(\d+\)\]\]", signature)) == len(ir.params) + len(ir.scalars)
    assert source.count("{") == source.count("}")
    assert "__syncthreads" not in source and "threadIdx" not in source and "expf(" not in source
    if shutil.which("xcrun"):                      # macOS: compile it
        import subprocess
        (tmp_path / "k.metal").write_text(source)
        subprocess.run(["xcrun", "metal", "-c", str(tmp_path / "k.metal"), "-o",
                        str(tmp_path / "k.air")], check=True)


@pytest.mark.parametrize("emit,name", [(opencl.emit_kernel, "OpenCL"), (hip.emit_kernel, "HIP"),
                                       (metal.emit_kernel, "Metal")])
def test_nvidia_only_statements_are_refused(emit, name):
    k = Kernel("k", (Param("x", "f32", 4, True),), 1, 32, (CpAsyncCommit(), Sync()))
    with pytest.raises(CompileError, match="CpAsyncCommit"):
        emit(k)
