"""Every hand-built kernel's CUDA compiles with NVRTC for sm_80, sm_90 and sm_90a."""
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("cuda.bindings.nvrtc")

from strata.runtime.nvrtc import compile_cuda, include_dirs  # noqa: E402
from strata.codegen.cuda import emit_program  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import kernel_builders as B  # noqa: E402

if not include_dirs():
    pytest.skip("no CUDA headers (cuda_fp16.h) found", allow_module_level=True)

PROGRAMS = {
    "rms_norm_f32": lambda: B.rms_norm(),
    "rms_norm_bf16": lambda: B.rms_norm(dtype="bf16"),
    "rms_norm_f16": lambda: B.rms_norm(rows=8, cols=512, block=128, dtype="f16"),
    "elementwise": lambda: B.elementwise((1 << 20) + 3),
    "elementwise_to_bf16": lambda: B.elementwise(1000, "f32", "bf16"),
    "elementwise_wide": lambda: B.elementwise(3 << 30),
    "copy_f16": lambda: B.copy(1000, "f16"),
    "copy_bf16": lambda: B.copy(1000, "bf16"),
    "copy_u8": lambda: B.copy(1000, "u8"),
    "copy_bool": lambda: B.copy(1000, "bool"),
    "vec_f32x4": lambda: B.vector_scale(1024, "f32", 4),
    "vec_f32x2": lambda: B.vector_scale(1024, "f32", 2),
    "vec_f16x8": lambda: B.vector_scale(1024, "f16", 8),
    "vec_f16x4": lambda: B.vector_scale(1024, "f16", 4),
    "vec_bf16x8": lambda: B.vector_scale(1024, "bf16", 8),
    "vec_bf16x2": lambda: B.vector_scale(1024, "bf16", 2),
    "vec_i32x4": lambda: B.vector_scale(1024, "i32", 4),
    "vec_i64x2": lambda: B.vector_scale(1024, "i64", 2),
    "vec_u8x16": lambda: B.vector_scale(1024, "u8", 16),
    "special_constants": lambda: B.special_constants(),
    "zoo_f32": lambda: B.scalar_op_zoo("f32")[0],
    "zoo_f16": lambda: B.scalar_op_zoo("f16")[0],
    "zoo_i32": lambda: B.scalar_op_zoo("i32")[0],
    "zoo_i64": lambda: B.scalar_op_zoo("i64")[0],
}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_emitted_kernel_compiles(name, arch):
    cubin = compile_cuda(emit_program(PROGRAMS[name](), arch), arch)
    assert cubin[:4] == b"\x7fELF"


def test_multi_kernel_program_compiles():
    prog = B.rms_norm()
    for p in (B.elementwise(100), B.copy(10, "bf16"), B.vector_scale(64, "f16", 8)):
        prog.kernels += p.kernels
    assert compile_cuda(emit_program(prog))[:4] == b"\x7fELF"


@pytest.mark.parametrize("fn", [lambda i: i.clamp(0), lambda i: i.clamp(-2, 3),
                                lambda i: torch.minimum(i, torch.tensor(1))])
def test_integer_clamp_against_a_literal_compiles(fn):
    """max(long long, int) is ambiguous for NVRTC: the literal must take the value's type."""
    from conftest import run_and_compare
    run_and_compare(fn, (torch.randint(-5, 5, (37,)),))
