"""The runtime side of a wgmma kernel, on a stand-in driver without a GPU: the function's dynamic
shared-memory limit raised at load, sharedMemBytes at every launch, the code built for sm_90a on
an sm_90 device, and each tensor map encoded from the argument's real device pointer at launch.
The stand-in's "encoding" carries the address, and its launch runs the kernel in the simulator
on the memory behind the addresses, so the result is checked against eager too."""
import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import strata
from strata.bench import check
from strata.core import dtypes
from strata.api import to_numpy
from strata.core.context import Context
from strata.kernel_ir.sim import run_kernel
from strata.kernel_ir.sim_memory import storage_numpy
from strata.runtime import program as runtime_program
from strata.runtime.program import CudaProgram
from strata.codegen.cfamily import cname
from fake_cuda import LauncherCalls


class _Names:
    """An enum of the CUDA API whose members are their own names."""

    def __getattr__(self, member):
        return member


class StandInDriver(LauncherCalls):
    """runtime/driver.py's interface over CPU memory (see tests/runtime/test_cuda_program.py),
    plus cuFuncSetAttribute and cuTensorMapEncodeTiled: the 'map' holds the address it was
    encoded from in its first word."""

    def __init__(self, program):
        self.kernels = {cname(k.name): k for k in program.kernels}
        self.attributes, self.launches, self.encoded, self.archs = [], [], [], []
        self.errors = []

    def context(self, device):
        return "ctx"

    def make_current(self, ctx):
        pass

    def arch(self, device):
        return "sm_90"

    def current_stream(self, device):
        return 7

    def load_module(self, image, what=""):
        return "module"

    def get_function(self, module, name):
        return ("function", name)

    def set_function_attribute(self, function, attribute, value, kernel=""):
        self.attributes.append((function[1], attribute, value))

    def _cu(self):
        return SimpleNamespace(CUtensorMapDataType=_Names(), CUtensorMapInterleave=_Names(),
                               CUtensorMapSwizzle=_Names(), CUtensorMapL2promotion=_Names(),
                               CUtensorMapFloatOOBfill=_Names(), cuuint32_t=int, cuuint64_t=int)

    def call(self, name, *args, detail=""):
        assert name == "cuTensorMapEncodeTiled"
        address, dims, strides, box = args[2:6]
        self.encoded.append((address, tuple(dims), tuple(strides), tuple(box), args[8]))
        return SimpleNamespace(opaque=[address] + [0] * 15)

    def launch(self, function, kernel, grid, block, params_address, stream, smem_bytes=0):
        k = self.kernels[kernel]
        self.launches.append((kernel, smem_bytes))
        slots = (ctypes.c_uint64 * len(k.params)).from_address(params_address)
        memory = {}
        for p, slot in zip(k.params, slots):
            address = ctypes.c_uint64.from_address(slot).value    # a map's first word: its address
            nbytes = p.numel * dtypes.ITEMSIZE[p.dtype]
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
            memory[p.name] = raw.view(storage_numpy(p.dtype))
        run_kernel(k, memory)


@pytest.fixture
def no_nvrtc(monkeypatch):
    archs = []
    monkeypatch.setattr(runtime_program, "compile_cubin",
                        lambda source, arch, names: archs.append(arch) or b"cubin")
    return archs


def test_wgmma_kernel_runs_with_dynamic_smem_and_tensor_maps_from_real_pointers(no_nvrtc):
    x, w, b = (torch.randn(40, 128).to(torch.bfloat16), torch.randn(200, 128).to(torch.bfloat16),
               torch.randn(200).to(torch.bfloat16))
    prog = strata.compile(F.linear, (x, w, b), ctx=Context(target="sm_90a"))
    kp = prog.lowered.kernel
    (k,) = kp.kernels
    assert k.dynamic_smem_bytes > 48 * 1024          # 2 stages of 128x128 + 128x64 tiles
    driver = StandInDriver(kp)
    tp = prog.torch_program
    rt = CudaProgram(kp, inputs=tp.inputs, weights=tp.weights, device="cpu", driver=driver,
                     poison=True)
    assert no_nvrtc == ["sm_90a"] and rt.arch == "sm_90a"
    assert driver.attributes == [(cname(k.name), "MAX_DYNAMIC_SHARED_SIZE_BYTES", k.dynamic_smem_bytes)]
    got = rt.run([x, w, b])
    assert driver.launches == [(cname(k.name), k.dynamic_smem_bytes)]
    maps = {p.name: p for p in k.params if p.tensor_map is not None}
    assert len(maps) == 2 and len(driver.encoded) == 2
    # a tensor map is encoded once, over the program's own buffer for an input (x and w here:
    # the call copies them there on the device)
    static = {t.data_ptr() for _, t in rt._pinned_in}
    assert {a for a, *_ in driver.encoded} == static and len(static) == 2
    for address, dims, strides, box, swizzle in driver.encoded:
        assert swizzle == "CU_TENSOR_MAP_SWIZZLE_128B" and box[0] == 64 and dims[0] == 128
        assert strides == (256,)
    ref = check.eager_reference(F.linear, (x, w, b))[0]
    res = check.compare("linear", "bf16", to_numpy(got[0]), ref, check.tolerance("bf16", True))
    assert res.passed, res.rel
    x2 = torch.randn(40, 128).to(torch.bfloat16)     # a second call encodes nothing
    got2 = rt.run([x2, w, b])
    assert len(driver.encoded) == 2 and driver.errors == []
    ref2 = check.eager_reference(F.linear, (x2, w, b))[0]
    assert check.compare("linear", "bf16", to_numpy(got2[0]), ref2,
                         check.tolerance("bf16", True)).passed


def test_kernels_without_dynamic_smem_launch_as_before(no_nvrtc):
    x, w = torch.randn(40, 128).to(torch.bfloat16), torch.randn(200, 128).to(torch.bfloat16)
    prog = strata.compile(F.linear, (x, w), ctx=Context(target="sm_80"))
    kp = prog.lowered.kernel
    assert all(k.dynamic_smem_bytes == 0 for k in kp.kernels)
    driver = StandInDriver(kp)
    tp = prog.torch_program
    rt = CudaProgram(kp, inputs=tp.inputs, weights=tp.weights, device="cpu", driver=driver)
    assert no_nvrtc == ["sm_90"] and driver.attributes == []
    rt.run([x, w])
    assert [s for _, s in driver.launches] == [0] * len(kp.kernels)
