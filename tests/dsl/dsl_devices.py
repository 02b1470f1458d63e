"""The devices @strata.kernel tests run on: the simulator and the CPU always; OpenCL where
pyopencl finds a device (Debian's PoCL, installed by the README's test command), else the tests
skip saying why."""
import pytest


def _opencl_missing() -> str:
    try:
        import pyopencl as cl
    except ImportError:
        return "pyopencl is not installed (pip install -e '.[test]')"
    try:
        if any(p.get_devices() for p in cl.get_platforms()):
            return ""
    except cl.Error:
        pass
    return "no OpenCL device: install PoCL (apt-get install pocl-opencl-icd)"


OPENCL_MISSING = _opencl_missing()
DEVICES = ["sim", "cpu", pytest.param("opencl", marks=pytest.mark.skipif(
    bool(OPENCL_MISSING), reason=OPENCL_MISSING))]
