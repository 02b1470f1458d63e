"""device="cuda" without a GPU: the launch path (NVRTC cubin, module and function loaded once,
kernelParams packed with pointers and scalars by value, torch's stream) runs against a stand-in
driver that decodes kernelParams exactly as cuLaunchKernel does and runs the kernel in the
simulator on the memory those pointers name. On a GPU machine the real launch is tested too."""
import ctypes

import numpy as np
import pytest
import torch

import strata as st
from strata.dsl import kernel as dsl_kernel

pytest.importorskip("cuda.bindings.nvrtc")

_CTYPES = {"bool": ctypes.c_bool, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
           "f32": ctypes.c_float, "f64": ctypes.c_double}


class SimDriver:
    def __init__(self, tensors):
        self.by_address = {t.data_ptr(): t for t in tensors}
        self.loaded, self.launches = [], []

    def context(self, device):
        return "ctx"

    def arch(self, device):
        return "sm_90"

    def make_current(self, ctx):
        assert ctx == "ctx"

    def current_stream(self, device):
        return 7

    def load_module(self, image, what):
        assert len(image) > 0
        self.loaded.append(what)
        return "module"

    def get_function(self, module, name):
        return name

    def launch(self, function, name, grid, block, params, stream):
        k = [k for k, *_ in dsl_kernel._CUDA.values() if k.name == name][-1]   # the latest built
        assert (grid, block, stream) == (k.grid, k.block, 7)
        slots = (ctypes.c_uint64 * (len(k.params) + len(k.scalars))).from_address(params)
        tensors = {p.name: self.by_address[ctypes.c_uint64.from_address(slots[i]).value]
                   for i, p in enumerate(k.params)}
        scalars = {n: _CTYPES[t].from_address(slots[len(k.params) + j]).value
                   for j, (n, t) in enumerate(k.scalars)}
        self.launches.append(scalars)
        dsl_kernel.run_sim(k, tensors, scalars)


@st.kernel
def axpy(x, y, out, n: int, alpha: float, flip: bool, BLOCK: st.constexpr):
    i = st.program_id(0) * BLOCK + st.thread_id(0)
    if i < n:
        out[i] = (-alpha if flip else alpha) * x[i] + y[i]


def test_launch_packs_pointers_and_scalars_by_value(monkeypatch):
    n = 300
    x, y, out = torch.randn(n), torch.randn(n), torch.zeros(n)
    drv = SimDriver([x, y, out])
    k = axpy.kernel_ir((x, y, out, n, 1.5, True), {"BLOCK": 128}, grid=3, block=128)
    for alpha, flip in ((1.5, True), (0.25, False)):
        dsl_kernel.run_cuda(k, {"x": x, "y": y, "out": out}, {"n": n, "alpha": alpha,
                                                              "flip": flip}, driver=drv)
        want = (-alpha if flip else alpha) * x + y
        assert torch.allclose(out, want)
    assert drv.loaded == ["axpy"]                   # one module per specialisation
    assert drv.launches == [{"n": 300, "alpha": 1.5, "flip": True},
                            {"n": 300, "alpha": 0.25, "flip": False}]


def test_without_a_gpu_device_cuda_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    x = torch.zeros(4)
    with pytest.raises(st.StrataError, match="needs a CUDA GPU"):
        axpy[1, 4](x, x, x, 4, 1.0, False, BLOCK=4, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu():
    n = 1000
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.zeros(n, device="cuda")
    axpy[(n + 255) // 256, 256](x, y, out, n, 2.0, False, BLOCK=256)
    assert torch.allclose(out, 2.0 * x + y)


def test_a_checked_launch_reports_the_stray_access(monkeypatch):
    """checked=True on device="cuda": the fault buffer travels as one more pointer."""
    n = 300
    x, y, out = torch.randn(n), torch.randn(n), torch.zeros(n)
    drv = SimDriver([x, y, out])

    def run(k, tensors, scalars):
        drv.by_address.update({t.data_ptr(): t for t in tensors.values()})
        dsl_kernel.run_cuda(k, tensors, scalars, driver=drv)
    monkeypatch.setitem(dsl_kernel._RUNNERS, "cuda", run)
    axpy[3, 128](x, y, out, n, 2.0, False, BLOCK=128, device="cuda", checked=True)
    assert torch.allclose(out, 2.0 * x + y)
    with pytest.raises(st.StrataError, match=r"out-of-bounds load of x\[300\] \(size 300\)"):
        axpy[3, 128](x, y, out, n + 1, 2.0, False, BLOCK=128, device="cuda", checked=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_checked_launch_on_a_gpu():
    x = torch.randn(100, device="cuda")
    out = torch.zeros(100, device="cuda")
    with pytest.raises(st.StrataError, match=r"out-of-bounds load of x\[100\] \(size 100\)"):
        axpy[1, 128](x, x, out, 101, 2.0, False, BLOCK=128, checked=True)
