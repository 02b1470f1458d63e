"""NVRTC: cubin and PTX out, CompileError with kernel names and the log when the source is bad."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from strata.core.errors import CompileError  # noqa: E402
from strata.runtime import nvrtc  # noqa: E402
from strata.codegen.cuda import emit_program  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import kernel_builders as B  # noqa: E402


def test_version_and_headers():
    major, minor = nvrtc.nvrtc_version()
    assert major >= 12 and minor >= 0
    assert any(Path(d, "cuda_bf16.h").is_file() for d in nvrtc.include_dirs())


def test_cubin_and_ptx():
    src = emit_program(B.elementwise(1000))
    cubin, seconds = nvrtc.compile_cuda_timed(src, "sm_90")
    assert cubin[:4] == b"\x7fELF" and seconds > 0
    ptx = nvrtc.compile_cuda(src, "sm_80", want="ptx").decode()
    assert ".target sm_80" in ptx and ".entry k_ew_sigmoid(" in ptx


def test_kernel_names_are_found_in_the_source():
    prog = B.rms_norm()
    prog.kernels += B.copy(10, "f16").kernels
    assert nvrtc.kernel_names_in(emit_program(prog)) == ["k_rms_norm_reduce", "k_copy_f16"]


def test_broken_source_raises_compile_error_with_kernel_and_log():
    src = emit_program(B.rms_norm()).replace("rsqrtf(v3)", "rsqrtf(v3) + undefined_thing")
    with pytest.raises(CompileError) as info:
        nvrtc.compile_cuda(src, "sm_90")
    msg = str(info.value)
    assert "k_rms_norm_reduce" in msg and "sm_90" in msg
    assert 'identifier "undefined_thing" is undefined' in msg          # the NVRTC log
    assert "float v4 = rsqrtf(v3) + undefined_thing;" in msg           # the offending line


def test_explicit_kernel_names_are_used_in_errors():
    with pytest.raises(CompileError, match="k_one, k_two"):
        nvrtc.compile_cuda("this is not C", "sm_80", kernel_names=("k_one", "k_two"))


def test_bad_arch_and_bad_want():
    with pytest.raises(CompileError, match="sm_90x"):
        nvrtc.compile_cuda(emit_program(B.copy(4, "f32")), "sm_90x")
    with pytest.raises(ValueError):
        nvrtc.compile_cuda(emit_program(B.copy(4, "f32")), want="sass")


def test_importing_strata_does_not_load_cuda_bindings():
    code = ("import sys, strata.runtime.nvrtc, strata.codegen.cuda, strata.kernel_ir.sim; "
            "assert 'cuda.bindings.nvrtc' not in sys.modules, 'loaded'")
    subprocess.run([sys.executable, "-c", code], check=True)
