"""What the stand-in drivers of the CUDA runtime tests share: fake_libcuda.c, built once, whose
launches call back into the driver object that loaded the function (its `launch`), and the three
driver calls the C launcher needs (library, handle, error_text).

Why: CudaProgram launches through runtime/cuda_launcher.c, which opens libcuda itself; with this
library in its place the whole C path (plans, graph building, node updates) runs on the CPU and
the kernels in the simulator."""
from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

from strata.runtime import cc

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                             ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p)
_STATE: dict = {}
FUNCTIONS: dict[int, tuple] = {}           # handle -> (driver, its function object)


def _on_launch(handle, grid, block, smem, params, stream):
    driver, function = FUNCTIONS[handle]
    try:
        driver.launch(function, function[1], grid, block, params, stream, smem_bytes=smem)
    except Exception as e:                  # ctypes would print and drop it: keep it for the test
        driver.errors.append(e)
        return 1
    return 0


def fake_libcuda() -> tuple[str, ctypes.CDLL]:
    """(path, the library as loaded here): the launcher's dlopen of the path gets this one."""
    if "lib" not in _STATE:
        source = Path(__file__).with_name("fake_libcuda.c").read_text()
        path = Path(tempfile.mkdtemp(prefix="strata-fake-cuda-"), "libcuda.so")
        path.write_bytes(cc.compile_shared(source, cc.find_compiler()))
        lib = ctypes.CDLL(str(path))
        _STATE["callback"] = _CALLBACK(_on_launch)
        lib.fake_on_launch(_STATE["callback"])
        _STATE["lib"], _STATE["path"] = lib, str(path)
    return _STATE["path"], _STATE["lib"]


def counts() -> dict[str, int]:
    """What the fake driver was asked, since the process started."""
    out = (ctypes.c_long * 6)()
    fake_libcuda()[1].fake_counts(out)
    return dict(zip(("launches", "graphs", "node_updates", "graph_launches", "contexts",
                     "programmatic_edges"), out))


class LauncherCalls:
    """Mixed into a stand-in driver: `kernels` (name -> Kernel IR kernel) and `launch` it has."""

    errors: list

    def library(self):
        return fake_libcuda()[0]

    def handle(self, obj) -> int:
        if obj == "ctx":
            return 1
        handle = id(obj)
        if handle not in FUNCTIONS:
            k = self.kernels[obj[1]]
            sizes = [128 if p.tensor_map is not None else 8 for p in k.params]
            fake_libcuda()[1].fake_params(ctypes.c_void_p(handle), len(sizes),
                                          (ctypes.c_int * max(1, len(sizes)))(*sizes))
        FUNCTIONS[handle] = (self, obj)
        return handle

    def error_text(self, status: int) -> str:
        return {700: "CUDA_ERROR_ILLEGAL_ADDRESS", 719: "CUDA_ERROR_LAUNCH_FAILED"}.get(
            status, f"CUresult {status}")
