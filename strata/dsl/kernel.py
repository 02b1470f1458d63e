"""@strata.kernel: a SIMT kernel written in Python, launched as `k[grid, block](*args)`.

Why this shape: it is the launch syntax GPU programmers know (Triton, Numba, locomp), and one
function runs everywhere strata does:
  device="sim"   the simulator and sanitizer (kernel_ir/sim.py): races, out-of-bounds accesses and
                 divergent barriers are errors that name the user's line;
  device="cpu"   native C (codegen/c.py) after kernel_ir/thread_loops.py turns each block's threads
                 into loops split at barriers; blocks run on the cores (OpenMP);
  source(...)    CUDA C (codegen/cuda.py, compiled by NVRTC where it is installed) or C.
The default device is where the tensors are (CPU tensors and NumPy arrays: "cpu"). Tensors are
passed by reference (a kernel writes its outputs in place); ints, floats and bools are runtime
scalars; `st.constexpr` parameters are compiled in. Each specialisation (dtypes, shapes, grid,
block, constexpr values) is built once per KernelFunction.
"""
from __future__ import annotations

import ctypes
import inspect
import os
from math import prod

import numpy as np

from ..codegen import emit_source
from ..codegen.cfamily import cname
from ..codegen.cuda import emit_source as emit_cuda_source
from ..core import dtypes
from ..core.errors import DeviceUnavailable, InputMismatch, KernelSyntaxError, SimError, StrataError
from ..kernel_ir.bounds_check import FAULT, add_bounds_checks, fault_sentence
from ..kernel_ir.ir import Kernel
from ..kernel_ir.sim import run_kernel
from ..kernel_ir.sim_memory import storage_numpy
from ..kernel_ir.verify import KernelVerifyError, verify_kernel
from ..runtime import driver as cuda_driver
from ..runtime.launch import PackedArgs
from ..runtime.native_build import build_library, load_library
from .frontend import Spec, build
from .lang import constexpr

_SCALAR_TYPES = {bool: "bool", int: "i32", float: "f32"}


def kernel(fn=None):
    """Decorate a function as a SIMT kernel (see the module docstring)."""
    if fn is None:
        return kernel
    return KernelFunction(fn)


def _dims(v, what: str) -> tuple:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if not (1 <= len(t) <= 3 and all(isinstance(n, (int, np.integer)) and n >= 1 for n in t)):
        raise InputMismatch(f"the {what} is a positive int or a tuple of up to 3 of them, not {v!r}")
    return tuple(int(n) for n in t) + (1,) * (3 - len(t))


class KernelFunction:
    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.signature = inspect.signature(fn)
        self.cache: dict = {}
        self.last: tuple | None = None            # the key of the latest launch

    def __getitem__(self, launch):
        if not (isinstance(launch, tuple) and len(launch) == 2):
            raise InputMismatch(f"launch {self.__name__} as {self.__name__}[grid, block](...)")
        return _Launcher(self, _dims(launch[0], "grid"), _dims(launch[1], "block"))

    def __call__(self, *args, **kwargs):
        raise InputMismatch(f"a kernel is launched with a grid and a block: "
                            f"{self.__name__}[grid, block](...)")

    # ------------------------------------------------------------ specialisation

    def bind(self, args, kwargs) -> tuple[dict, dict]:
        """(the parameter kinds, name -> value) of one call."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise InputMismatch(f"{self.__name__}: {e}") from None
        kinds, values = {}, dict(bound.arguments)
        for name, p in self.signature.parameters.items():
            if name not in values:
                raise InputMismatch(f"{self.__name__}: missing argument {name}")
            v = values[name]
            if p.annotation is constexpr or p.annotation == "st.constexpr":
                kinds[name] = ("const", v)
            elif _is_tensor(v):
                kinds[name] = ("tensor", _dtype_of(v, name), tuple(v.shape))
            elif type(v) in _SCALAR_TYPES or isinstance(v, np.generic):
                kinds[name] = ("scalar", _scalar_dtype(v))
            else:
                raise InputMismatch(f"{self.__name__}: argument {name} is a "
                                    f"{type(v).__name__}; pass a tensor, an int, a float or a bool")
        return kinds, values

    def specialise(self, kinds: dict, grid: tuple, block: tuple) -> Kernel:
        key = (tuple(sorted((k, repr(v)) for k, v in kinds.items())), grid, block)
        k = self.cache.get(key)
        if k is None:
            if prod(block) > 1024:
                raise InputMismatch(f"{self.__name__}: a block of {prod(block)} threads (at most "
                                    f"1024)")
            k = build(self.fn, Spec(kinds, grid, block))
            try:
                verify_kernel(k, gpu=True)
            except KernelVerifyError as e:
                where = f"{inspect.getsourcefile(self.fn)}:{self.fn.__code__.co_firstlineno}"
                raise KernelSyntaxError(f"{where}: {str(e).split(': ', 1)[-1]}") from None
            self.cache[key] = k
        self.last = key
        return k

    def checked(self, k: Kernel) -> tuple[Kernel, list]:
        """k with its accesses bounds-checked, and the access sites (built once per k)."""
        key = ("checked", id(k))
        if key not in self.cache:
            self.cache[key] = (k,) + add_bounds_checks(k)
        return self.cache[key][1:]

    def kernel_ir(self, args=(), kwargs=None, grid=None, block=None) -> Kernel:
        """The Kernel IR for example arguments, else of the latest launch."""
        kwargs = kwargs or {}
        if args or kwargs:
            kinds, _ = self.bind(args, kwargs)
            return self.specialise(kinds, _dims(grid or 1, "grid"), _dims(block or 1, "block"))
        if self.last is None:
            raise StrataError(f"{self.__name__} has not been launched: pass example arguments "
                              f"(and grid=, block=) to see its code")
        return self.cache[self.last]

    def ir(self, stage: str = "kernel", *args, grid=None, block=None, **kwargs) -> str:
        if stage != "kernel":
            raise StrataError(f"a @strata.kernel has one IR, 'kernel' (not {stage!r})")
        return str(self.kernel_ir(args, kwargs, grid, block))

    def source(self, target: str = "cuda", *args, grid=None, block=None, **kwargs) -> str:
        """The source for `target` ("cuda", "c", "opencl", "hip" or "metal") of the latest launch
        or of example arguments."""
        k = self.kernel_ir(args, kwargs, grid, block)
        return source_of(k, target)


class _Launcher:
    def __init__(self, fn: KernelFunction, grid: tuple, block: tuple):
        self.fn, self.grid, self.block = fn, grid, block

    def __call__(self, *args, device: str | None = None, checked: bool = False, **kwargs):
        """checked=True: native launches test every access too (kernel_ir/bounds_check.py) and an
        out-of-bounds one is the simulator's SimError; the simulator always checks."""
        kinds, values = self.fn.bind(args, kwargs)
        tensors = {n: v for n, v in values.items() if kinds[n][0] == "tensor"}
        device = device or _device_of(tensors.values())
        k = self.fn.specialise(kinds, self.grid, self.block)
        run = _RUNNERS.get(device)
        if run is None:
            raise InputMismatch(f"device {device!r}: a kernel runs on "
                                f"{', '.join(map(repr, _RUNNERS))}")
        try:
            if checked and device != "sim":
                _run_checked(run, self.fn.checked(k), tensors, values)
            else:
                run(k, tensors, {n: values[n] for n, _ in k.scalars})
        except StrataError as e:      # the sentence, raised at the user's launch line; the
            if os.environ.get("STRATA_DEBUG"):          # simulator's frames with STRATA_DEBUG=1
                raise
            raise e.with_traceback(None) from None


# ---------------------------------------------------------------- running

def _run_checked(run, checked: tuple, tensors: dict, values: dict) -> None:
    import torch                   # lazy: the simulator needs NumPy only

    k, sites = checked
    device = next((t.device for t in tensors.values() if isinstance(t, torch.Tensor)), "cpu")
    fault = torch.zeros(2, dtype=torch.int64, device=device)
    run(k, {**tensors, FAULT: fault}, {n: values[n] for n, _ in k.scalars})
    sentence = fault_sentence(k.name, fault.tolist(), sites)
    if sentence:
        raise SimError(sentence)


def _is_tensor(v) -> bool:
    return isinstance(v, np.ndarray) or type(v).__module__.startswith("torch")


def _dtype_of(v, name: str) -> str:
    try:
        if isinstance(v, np.ndarray):
            return dtypes.from_torch(__import__("torch").from_numpy(np.empty(0, v.dtype)).dtype)
        return dtypes.from_torch(v.dtype)
    except Exception:
        raise InputMismatch(f"argument {name} has dtype {v.dtype}, which kernels do not take") from None


def _scalar_dtype(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "i32" if -2 ** 31 <= int(v) < 2 ** 31 else "i64"
    return "f32"


def _device_of(tensors) -> str:
    kinds = {getattr(getattr(t, "device", None), "type", "cpu") for t in tensors} or {"cpu"}
    if len(kinds) > 1:
        raise InputMismatch(f"the tensors are on different devices ({', '.join(sorted(kinds))})")
    return kinds.pop()


def _contiguous(name: str, t) -> None:
    ok = t.flags["C_CONTIGUOUS"] if isinstance(t, np.ndarray) else t.is_contiguous()
    if not ok:
        raise InputMismatch(f"argument {name} is not contiguous; kernels index contiguous data "
                            f"(pass .contiguous())")


def run_sim(k: Kernel, tensors: dict, scalars: dict) -> None:
    """Simulate one launch; tensors the kernel writes are updated in place."""
    import torch                   # lazy: the simulator needs NumPy only

    memory, written = {}, {p.name for p in k.params if p.output}
    for p in k.params:
        t = tensors[p.name]
        _contiguous(p.name, t)
        a = torch.as_tensor(t).reshape(-1)
        if p.dtype in ("bf16", "f16"):
            a = a.view(torch.int16)
        memory[p.name] = a.numpy().view(storage_numpy(p.dtype)).copy()
    run_kernel(k, memory, scalars)
    for name in written:
        t = tensors[name]
        out = torch.as_tensor(t)
        src = torch.from_numpy(memory[name].view(np.int16) if out.dtype in
                               (torch.bfloat16, torch.float16) else memory[name])
        if out.dtype in (torch.bfloat16, torch.float16):
            src = src.view(out.dtype)
        out.reshape(-1).copy_(src)


_LIBS: dict = {}            # id(kernel) -> (kernel, entry, argument array type)


def source_of(k: Kernel, target: str) -> str:
    return emit_source([k], target)


_SCALAR_C = {"bool": ctypes.c_bool, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
             "f32": ctypes.c_float, "f64": ctypes.c_double}


def run_cpu(k: Kernel, tensors: dict, scalars: dict) -> None:
    """One launch as native code on the CPU tensors (NumPy arrays are shared, not copied)."""
    import torch                   # lazy: the simulator needs NumPy only

    entry = _LIBS.get(id(k))
    if entry is None:                     # once per specialisation (k lives in its cache)
        lib = load_library(build_library(emit_source([k], "c")))
        fn = lib.strata_launch
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = None
        entry = _LIBS[id(k)] = (k, fn, ctypes.c_void_p * max(1, len(k.params) + len(k.scalars)))
    _, fn, array = entry
    ptrs, keep = [], []
    for p in k.params:
        t = tensors[p.name]
        if not isinstance(t, torch.Tensor):
            t = torch.as_tensor(t)
        if t.device.type != "cpu":
            raise InputMismatch(f"argument {p.name} is on {t.device}; device='cpu' takes CPU "
                                f"tensors")
        if not t.is_contiguous():
            _contiguous(p.name, t)
        ptrs.append(t.data_ptr() or None)
    for name, dtype in k.scalars:
        c = _SCALAR_C[dtype](scalars[name])
        keep.append(c)
        ptrs.append(ctypes.addressof(c))
    fn(array(*ptrs))

_CL: dict = {}              # OpenCL: the context and queue; id(kernel) -> (kernel, built kernel)


def run_opencl(k: Kernel, tensors: dict, scalars: dict) -> None:
    """One launch through pyopencl on its first device (PoCL's CPU driver here): tensors are
    copied to device buffers and the ones the kernel writes copied back."""
    import torch                   # lazy: the simulator needs NumPy only
    try:
        import pyopencl as cl      # optional: only for device="opencl"
    except ImportError:
        raise DeviceUnavailable("device='opencl' needs pyopencl and an OpenCL driver: pip install "
                                "pyopencl pocl-binary-distribution") from None
    if "queue" not in _CL:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
        if not devices:
            raise DeviceUnavailable("pyopencl finds no OpenCL device (pip install "
                                    "pocl-binary-distribution gives a CPU one)")
        _CL["ctx"] = cl.Context([devices[0]])
        _CL["queue"] = cl.CommandQueue(_CL["ctx"])
    ctx, queue = _CL["ctx"], _CL["queue"]
    launch = _CL.get(id(k), (None, None))[1]
    if launch is None:
        source = source_of(k, "opencl")
        try:
            launch = cl.Kernel(cl.Program(ctx, source).build(), cname(k.name))
            _CL[id(k)] = (k, launch)
        except cl.RuntimeError as e:
            errors = [line for line in str(e).splitlines() if "error" in line][-3:]
            raise StrataError(f"the OpenCL compiler rejected the generated code of {k.name} "
                              f"(a strata bug): {' | '.join(errors)}") from None
    mf, bufs, hosts = cl.mem_flags, [], {}
    for p in k.params:
        t = tensors[p.name]
        _contiguous(p.name, t)
        host = torch.as_tensor(t).reshape(-1)
        if host.dtype in (torch.bfloat16, torch.float16):
            host = host.view(torch.int16)
        host = host.cpu().numpy()
        hosts[p.name] = host
        bufs.append(cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
                    if host.size else cl.Buffer(ctx, mf.READ_WRITE, 1))
    args = bufs + [np.dtype({"bool": np.uint8, "i32": np.int32, "i64": np.int64,
                             "f32": np.float32, "f64": np.float64}[t]).type(scalars[n])
                   for n, t in k.scalars]
    launch(queue, (k.grid * k.block,), (k.block,), *args)
    for p, buf in zip(k.params, bufs):
        if p.output and hosts[p.name].size:
            out = np.empty_like(hosts[p.name])
            cl.enqueue_copy(queue, out, buf)
            dst = torch.as_tensor(tensors[p.name]).reshape(-1)
            src = torch.from_numpy(out)
            dst.copy_(src.view(dst.dtype) if dst.dtype in (torch.bfloat16, torch.float16) else src)
    queue.finish()


_CUDA: dict = {}            # id(kernel) -> (kernel, context, module, function)
_NUMPY = {"bool": np.bool_, "i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}


def run_cuda(k: Kernel, tensors: dict, scalars: dict, driver=None) -> None:
    """One launch on a CUDA GPU through NVRTC and strata's runtime: the cubin from the compile
    cache, loaded once per specialisation, launched on torch's current stream with no
    synchronisation (a kernel's outputs are ready when torch's next op on that stream runs).
    `driver`: runtime/driver.py, or a stand-in (the tests run one over the simulator)."""
    import torch                   # lazy: the simulator needs NumPy only

    from ..runtime.program import compile_cubin     # imports torch: lazy, as torch is here
    fake = driver is not None
    if driver is None:
        if not torch.cuda.is_available():
            raise DeviceUnavailable("device='cuda' needs a CUDA GPU; run on 'sim' or 'cpu' here")
        driver = cuda_driver
    ts = [torch.as_tensor(tensors[p.name]) for p in k.params]
    for p, t in zip(k.params, ts):
        if not (fake or t.is_cuda):
            raise InputMismatch(f"argument {p.name} is on {t.device}; device='cuda' takes CUDA "
                                f"tensors")
        _contiguous(p.name, t)
    device = next((t.device for t in ts if t.is_cuda), torch.device("cuda", 0))
    entry = _CUDA.get(id(k))
    if entry is None:
        ctx = driver.context(device)
        arch = driver.arch(device)
        image = compile_cubin(source_of_arch(k, arch), arch, [cname(k.name)])
        module = driver.load_module(image, k.name)
        entry = _CUDA[id(k)] = (k, ctx, module, driver.get_function(module, cname(k.name)))
    _, ctx, _, function = entry
    driver.make_current(ctx)
    args = PackedArgs([t.data_ptr() for t in ts] +
                      [np.array([scalars[n]], dtype=_NUMPY[t]) for n, t in k.scalars])
    driver.launch(function, cname(k.name), k.grid, k.block, args.address,
                  driver.current_stream(device))


def source_of_arch(k: Kernel, arch: str) -> str:
    return emit_cuda_source([k], arch)


_RUNNERS = {"sim": run_sim, "cpu": run_cpu, "opencl": run_opencl, "cuda": run_cuda}
