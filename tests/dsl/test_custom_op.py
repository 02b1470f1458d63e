"""st.custom_op: a @strata.kernel as a torch op, called eagerly, captured by torch.export and
kept by strata.compile as one kernel of the program (sim, CPU, and CUDA source for NVRTC)."""
import pytest
import torch

import strata
import strata as st


@st.kernel
def rmsnorm(x, w, out, eps: float, COLS: st.constexpr):
    row = st.program_id(0)
    lane = st.thread_id(0)
    ss = 0.0
    for c in range(lane, COLS, 32):
        ss += x[row, c] * x[row, c]
    ss = st.warp_sum(ss)
    scale = st.rsqrt(ss / COLS + eps)
    for c in range(lane, COLS, 32):
        out[row, c] = x[row, c] * scale * w[c]


rms = st.custom_op("strata_test::rmsnorm", rmsnorm, grid=lambda x, w, eps: x.shape[0], block=32,
                   out_shape=lambda x, w, eps: x.shape, constexprs={"COLS": 96})


def reference(x, w, eps):
    x, w = x.double(), w.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_eager_call_runs_the_kernel():
    x, w = torch.randn(5, 96), torch.randn(96)
    torch.testing.assert_close(rms(x, w, 1e-6).double(), reference(x, w, 1e-6), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("device", ["sim", "cpu"])
def test_compiled_program_keeps_the_kernel(device):
    w = torch.randn(96)

    def f(x):
        return rms(torch.relu(x) + 1.0, w, 1e-6) * 2.0
    x = torch.randn(7, 96)
    prog = strata.compile(f, (x,), device=device)
    torch.testing.assert_close(prog(x).double(), 2.0 * reference(torch.relu(x) + 1.0, w, 1e-6),
                               atol=1e-5, rtol=1e-5)
    assert "custom strata_test.rmsnorm.default(" in prog.ir("loop")
    kernels = prog.ir("kernel")
    assert kernels.count("\nkernel ") + kernels.startswith("kernel ") == 3   # relu+1, rms, *2
    assert "test_custom_op.py:" in kernels          # the author's lines, in the program's IR
    if device == "sim":
        assert "block=32" in kernels
    else:                                           # the CPU runs its 32 threads as loops
        assert "for st_thread = 0; < 32" in kernels


def test_cuda_source_of_a_program_with_a_custom_kernel_compiles():
    pytest.importorskip("cuda.bindings.nvrtc")
    from strata.runtime.nvrtc import compile_cuda
    w = torch.randn(96)
    prog = strata.compile(lambda x: rms(x, w, 1e-5), (torch.randn(3, 96),), device="sim")
    source = prog.source("cuda")
    assert "__shfl_xor_sync" in source
    assert len(compile_cuda(source, "sm_90")) > 0


def test_torch_compile_backend():
    w = torch.randn(96)
    fn = torch.compile(lambda x: rms(x, w, 1e-6).sum(-1), backend="strata")
    x = torch.randn(4, 96)
    torch.testing.assert_close(fn(x).double(), reference(x, w, 1e-6).sum(-1), atol=1e-4, rtol=1e-5)


def test_bad_registrations_are_one_sentence():
    with pytest.raises(st.StrataError, match="namespace::name"):
        st.custom_op("rmsnorm", rmsnorm, grid=1, block=32, out_shape=lambda *a: (1,))
    with pytest.raises(st.StrataError, match="no parameter 'y'"):
        st.custom_op("strata_test::bad", rmsnorm, grid=1, block=32, out_shape=lambda *a: (1,),
                     out="y")
