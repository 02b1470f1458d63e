"""On a machine with a CUDA GPU: the emitted kernels, compiled by NVRTC and launched through the
driver API, compute what the simulator computes. Skipped where no GPU is present.

The launcher here is deliberately minimal (one context, synchronous copies); the real runtime
lives in strata/runtime/launch.py."""
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.driver")
from cuda.bindings import driver as cu  # noqa: E402

from strata.kernel_ir.sim import simulate  # noqa: E402
from strata.kernel_ir.sim_memory import poison, to_storage, to_user  # noqa: E402
from strata.runtime.nvrtc import compile_cuda  # noqa: E402
from strata.codegen.cuda import emit_program  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import kernel_builders as B  # noqa: E402


def _ok(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return rest[0] if len(rest) == 1 else rest


def _device():
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
        err, n = cu.cuDeviceGetCount()
        if err != cu.CUresult.CUDA_SUCCESS or n == 0:
            return None
    except Exception:
        return None
    dev = _ok(cu.cuDeviceGet(0))
    ctx = _ok(cu.cuDevicePrimaryCtxRetain(dev))
    _ok(cu.cuCtxSetCurrent(ctx))
    A = cu.CUdevice_attribute
    major = _ok(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = _ok(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    return f"sm_{major}{minor}"


ARCH = _device()
pytestmark = pytest.mark.skipif(ARCH is None, reason="no CUDA GPU")


def run_on_gpu(program, inputs):
    module = _ok(cu.cuModuleLoadData(compile_cuda(emit_program(program, ARCH), ARCH)))
    host, dev = {}, {}
    for b in program.buffers:
        host[b.name] = (np.ascontiguousarray(to_storage(np.asarray(inputs[b.name]).reshape(-1), b.dtype))
                        if b.kind in ("input", "weight") else poison(b.dtype, b.numel))
        dev[b.name] = _ok(cu.cuMemAlloc(max(1, host[b.name].nbytes)))
        _ok(cu.cuMemcpyHtoD(dev[b.name], host[b.name].ctypes.data, host[b.name].nbytes))
    for k in program.kernels:
        fn = _ok(cu.cuModuleGetFunction(module, k.name.encode()))
        ptrs = [np.array([int(dev[p.name])], dtype=np.uint64) for p in k.params]
        args = np.array([p.ctypes.data for p in ptrs], dtype=np.uint64)
        _ok(cu.cuLaunchKernel(fn, k.grid, 1, 1, k.block, 1, 1, 0, 0, args.ctypes.data, 0))
    _ok(cu.cuCtxSynchronize())
    out = {}
    for name in program.outputs:
        b = program.buffer(name)
        _ok(cu.cuMemcpyDtoH(host[name].ctypes.data, dev[name], host[name].nbytes))
        out[name] = to_user(host[name], b.dtype).reshape(b.shape)
    for d in dev.values():
        _ok(cu.cuMemFree(d))
    _ok(cu.cuModuleUnload(module))
    return out


RNG = np.random.default_rng(3)


def floats(shape, dtype):
    x = RNG.standard_normal(shape).astype(np.float32)
    return x.astype(np.float16) if dtype == "f16" else x


CASES = {
    "rms_norm_f32": (lambda: B.rms_norm(), lambda: {"x": floats((1, 32, 2048), "f32"),
                                                     "p_weight": floats(2048, "f32")}),
    "rms_norm_bf16": (lambda: B.rms_norm(dtype="bf16"), lambda: {"x": floats((1, 32, 2048), "bf16"),
                                                                  "p_weight": floats(2048, "bf16")}),
    "elementwise_tail": (lambda: B.elementwise((1 << 20) + 3),
                         lambda: {"x": floats((1 << 20) + 3, "f32"), "y": floats((1 << 20) + 3, "f32")}),
    "vec_f16x8": (lambda: B.vector_scale(4096, "f16", 8), lambda: {"x": floats(4096, "f16")}),
    "vec_bf16x8": (lambda: B.vector_scale(4096, "bf16", 8), lambda: {"x": floats(4096, "bf16")}),
    "vec_f32x4": (lambda: B.vector_scale(4096, "f32", 4), lambda: {"x": floats(4096, "f32")}),
    "zoo_f32": (lambda: B.scalar_op_zoo("f32")[0],
                lambda: {"x": (RNG.random(256) * 4 + 0.1).astype(np.float32),
                         "y": (RNG.random(256) * 3 + 0.1).astype(np.float32)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_simulator(name):
    make, inputs = CASES[name]
    prog, data = make(), inputs()
    want = simulate(prog, data)
    got = run_on_gpu(prog, data)
    for k in want:
        assert not np.isnan(got[k].astype(np.float64)).any()
        tol = 1e-2 if "bf16" in name else 1e-5
        np.testing.assert_allclose(got[k].astype(np.float64), want[k].astype(np.float64),
                                   rtol=tol, atol=tol)
