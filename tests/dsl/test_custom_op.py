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


def _rms_backward(grad, x, w, eps):
    """RMSNorm's gradients as torch ops: y = x r w with r = rsqrt(mean(x^2) + eps)."""
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    gw = grad * w
    dx = r * gw - x * r.pow(3) * (gw * x).mean(-1, keepdim=True)
    return dx, (grad * x * r).sum(0), None


rms_trained = st.custom_op("strata_test::rmsnorm_trained", rmsnorm, grid=lambda x, w, eps: x.shape[0],
                           block=32, out_shape=lambda x, w, eps: x.shape, constexprs={"COLS": 96},
                           backward=_rms_backward)


class Normed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.w = torch.nn.Linear(40, 96), torch.nn.Parameter(1 + 0.1 * torch.randn(96))
        self.head = torch.nn.Linear(96, 3)

    def forward(self, x):
        return self.head(rms_trained(self.lin(x), self.w, 1e-6))


def test_a_kernel_with_a_backward_trains_through_torch_compile():
    """The kernel runs forward, its backward formula backward: eagerly (autograd), and under
    torch.compile(backend="strata") as part of the compiled forward and backward programs;
    20 AdamW steps keep the losses within 1e-4 of eager's."""
    import copy
    torch.manual_seed(0)
    torch._dynamo.reset()
    model, x, y = Normed(), torch.randn(6, 40), torch.randn(6, 3)
    ref = copy.deepcopy(model)
    fast = torch.compile(model, backend="strata")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, ref)]
    for _ in range(20):
        losses = []
        for run, opt in zip((fast, ref), opts):
            loss = torch.nn.functional.mse_loss(run(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) < 1e-4, losses
    xd, wd = torch.randn(4, 96, dtype=torch.float64, requires_grad=True), torch.randn(96, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: _rms_backward_checked(a, b), (xd, wd))
    torch._dynamo.reset()


def _rms_backward_checked(x, w):
    """The formula itself against autograd of the reference (float64): a custom Function over
    `reference` whose backward is _rms_backward."""
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return reference(x, w, 1e-6)

        @staticmethod
        def backward(ctx, g):
            return _rms_backward(g, *ctx.saved_tensors, 1e-6)[:2]
    return F.apply(x, w)


def test_a_backward_with_the_wrong_number_of_gradients_is_one_sentence():
    bad = st.custom_op("strata_test::rmsnorm_bad_bw", rmsnorm, grid=lambda x, w, eps: x.shape[0],
                       block=32, out_shape=lambda x, w, eps: x.shape, constexprs={"COLS": 96},
                       backward=lambda g, x, w, eps: (g, None))
    x = torch.randn(2, 96, requires_grad=True)
    with pytest.raises(st.StrataError, match="returned 2 gradients; the op takes 3 arguments"):
        bad(x, torch.randn(96), 1e-6).sum().backward()
