"""Kernel IR -> HIP C++ for AMD GPUs: CUDA's walk with HIP's names.

Why so small: HIP keeps CUDA's kernel language (__global__, __shared__, __syncthreads,
threadIdx, atomicAdd), so this is codegen/cuda.py's emitter with HIP's headers, its bf16 type and
its shuffles, `__shfl_xor(v, mask, 32)`: width 32 keeps CUDA's 32-lane groups on AMD's 64-lane
wavefronts. Tensor cores, asynchronous copies and TMA are NVIDIA's (mma.sync, cp.async, wgmma)
and are refused. Compiled with hipcc where it is installed; tests compile it through a
HIP-on-CUDA header with NVRTC, which is what HIP itself does on NVIDIA GPUs.
"""
from __future__ import annotations

from ..kernel_ir.ir import Atomic, Kernel, walk
from .cfamily import refuse_unprintable
from .cuda import ATOMIC_PRELUDE, PRELUDE, CudaEmitter

HEADER = "#include <hip/hip_runtime.h>\n#include <hip/hip_fp16.h>\n#include <hip/hip_bf16.h>"


class HipEmitter(CudaEmitter):
    """CUDA's walk with HIP's shuffles (the names and bf16 type are replaced after)."""
    def shfl(self, fn: str, value, arg: str, dtype: str) -> str:
        fn = {"__shfl_xor_sync": "__shfl_xor", "__shfl_sync": "__shfl"}[fn]
        if dtype == "bool":
            return f"(bool){fn}((int){self.expr(value)}, {arg}, 32)"
        return f"{fn}({self.expr(value)}, {arg}, 32)"


def emit_kernel(kernel: Kernel) -> str:
    refuse_unprintable(kernel, "hip", "HIP cannot run: tensor cores, cp.async, TMA are NVIDIA-only")
    return HipEmitter(kernel).kernel().replace("__nv_bfloat16", "__hip_bfloat16")


def emit_source(kernels: list[Kernel]) -> str:
    parts = [f"// strata: {len(kernels)} kernel(s) for HIP (AMD GPUs): "
             f"{', '.join(k.name for k in kernels)}", HEADER, PRELUDE.rstrip()]
    if any(isinstance(s, Atomic) for k in kernels for s in walk(k.body)):
        parts.append(ATOMIC_PRELUDE)
    return "\n\n".join(parts + [emit_kernel(k) for k in kernels]) + "\n"
