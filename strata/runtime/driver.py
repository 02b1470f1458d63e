"""Thin checked wrappers over `cuda.bindings.driver`: the only module that calls the CUDA driver.

Why: every driver call returns a CUresult that is easy to drop; here each one is checked and a
failure raises CudaError, one sentence naming the call and the error (a launch also names the
kernel, its grid and block). Kernels run in the device's *primary* context, the one torch's
runtime API uses, so the data pointers of torch CUDA tensors are valid in our launches, and a
launch on torch's current stream is ordered with torch's own work (and captured by
torch.cuda.graph). cuda.bindings and torch.cuda are touched only inside the functions, so strata
imports on a machine without CUDA.

The functions taking a `device` (context, arch, current_stream) and the handles the others
return are what `runtime.program.CudaProgram` needs; tests replace this module with a fake that
runs the simulator (tests/runtime/test_cuda_program.py).
"""
from __future__ import annotations

from ..core.errors import CudaError, DeviceUnavailable

_CONTEXTS: dict[int, object] = {}


def _cu():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise DeviceUnavailable("--device cuda needs the cuda-bindings package (pip install "
                                "cuda-bindings), which is not installed") from e
    return driver


def error_name(err) -> str:
    """CUDA_ERROR_... for a CUresult (falls back to the enum's own name)."""
    cu = _cu()
    status, name = cu.cuGetErrorName(err)
    if status == cu.CUresult.CUDA_SUCCESS and name:
        return name.decode() if isinstance(name, bytes) else str(name)
    return getattr(err, "name", str(err))


def call(name: str, *args, detail: str = ""):
    """cuda.bindings.driver.<name>(*args), checked: returns the result values (None, one value,
    or a tuple), raises CudaError naming the call (plus `detail`) and the error."""
    cu = _cu()
    try:
        result = getattr(cu, name)(*args)
    except Exception as e:   # e.g. libcuda.so missing: the bindings raise instead of returning
        raise CudaError(f"{name} raised {type(e).__name__}: {e}{detail}") from e
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise CudaError(f"{name} failed with {error_name(err)}{detail}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _index(device) -> int:
    import torch
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def context(device):
    """The primary context of `device` (torch's), retained once and made current on this thread."""
    import torch
    index = _index(device)
    ctx = _CONTEXTS.get(index)
    if ctx is None:
        torch.cuda.init()
        torch.cuda.synchronize(index)      # torch has created (and made current) its context
        call("cuInit", 0)
        dev = call("cuDeviceGet", index)
        ctx = call("cuDevicePrimaryCtxRetain", dev, detail=f" for device {index}")
        _CONTEXTS[index] = ctx
    make_current(ctx)
    return ctx


def make_current(ctx) -> None:
    call("cuCtxSetCurrent", ctx)


def arch(device) -> str:
    """sm_XY of `device` (sm_90 on H100/H200, sm_80 on A100)."""
    import torch
    major, minor = torch.cuda.get_device_capability(_index(device))
    return f"sm_{major}{minor}"


def current_stream(device) -> int:
    """The raw handle of torch's current stream on `device` (the capture stream inside
    torch.cuda.graph); torch's own raw-stream call where the wheel has it (well under 1 µs)."""
    import torch
    index = _index(device)
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def library() -> str:
    """The driver library runtime/cuda_launcher.c opens."""
    return "libcuda.so.1"


def handle(obj) -> int:
    """The raw value of a CUfunction or CUcontext handle, for the C launcher."""
    return int(obj)


def error_text(status: int) -> str:
    """CUDA_ERROR_... for a CUresult returned as a plain int (by the C launcher)."""
    return error_name(_cu().CUresult(status))


def load_module(image: bytes, what: str = ""):
    """cuModuleLoadData on a cubin in the current context."""
    return call("cuModuleLoadData", image, detail=f" loading {what}" if what else "")


def get_function(module, name: str):
    return call("cuModuleGetFunction", module, name.encode(), detail=f" for kernel {name}")


def function_attribute(function, attribute: str, kernel: str = "") -> int:
    """cuFuncGetAttribute(CU_FUNC_ATTRIBUTE_<attribute>), e.g. NUM_REGS, LOCAL_SIZE_BYTES."""
    cu = _cu()
    attr = getattr(cu.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{attribute}")
    return int(call("cuFuncGetAttribute", attr, function,
                    detail=f" for kernel {kernel}" if kernel else ""))


def set_function_attribute(function, attribute: str, value: int, kernel: str = "") -> None:
    """cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_<attribute>), e.g. MAX_DYNAMIC_SHARED_SIZE_BYTES."""
    cu = _cu()
    attr = getattr(cu.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{attribute}")
    call("cuFuncSetAttribute", function, attr, int(value),
         detail=f" setting {attribute}={value} for kernel {kernel}" if kernel else "")


def launch(function, kernel: str, grid: int, block: int, params_address: int, stream: int,
           smem_bytes: int = 0) -> None:
    """cuLaunchKernel on a 1-D grid; `params_address` is the address of the void*[] array of
    pointers to the argument values (see runtime.launch.PackedArgs)."""
    cu = _cu()
    call("cuLaunchKernel", function, grid, 1, 1, block, 1, 1, smem_bytes, cu.CUstream(stream),
         params_address, 0, detail=f" launching {kernel} (grid {grid}, block {block})")


def synchronize() -> None:
    """Wait for the current context's work; a kernel fault surfaces here as CudaError."""
    call("cuCtxSynchronize")
