"""Integer bitwise ops (&, |, ^, ~, <<, >>) through every stage against torch eager, bit for bit:
in the simulator and natively on the CPU, on every integer dtype, with torch's promotion and its
shift counts outside [0, width); the Q4_0 nibble unpack and a compiled q4_0 QuantLinear."""
import pytest
import torch

import strata
from conftest import HAS_CC
from strata.quant.formats import QuantLinear

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
DEVICES = ["sim", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CC, reason="no C compiler"))]


def ints(*shape, dtype):
    """Values over the dtype's whole range (negative ones for signed types)."""
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -2 ** 62), min(info.max, 2 ** 62) + 1, shape, dtype=dtype)


def counts(*shape, dtype):
    """Shift counts in [-2, width + 2] (in range and out of it; uint8 has no negative ones)."""
    bits = torch.iinfo(dtype).bits
    return torch.randint(0 if dtype == torch.uint8 else -2, bits + 3, shape).to(dtype)


def every_op(x, y, n, s, one, empty, t, row):
    """x, y, n: [7]; s: 0-d; one: [1]; empty: [0]; t: [3, 5], not contiguous; row: [5]."""
    bits = torch.iinfo(x.dtype).bits
    return (x & y, x | y, x ^ y, ~x, torch.bitwise_and(x, y), torch.bitwise_xor(x, 0x5A),
            x & 15, 0x33 | x, x >> 4, x << 3, x >> bits + 1, x << bits, x >> bits - 1,
            x << n, x >> n, torch.bitwise_left_shift(x, n), torch.bitwise_right_shift(x, n),
            torch.bitwise_right_shift(3, n & 7), ((x & 0x7F) >> 2) << 1, ~(x >> 1) & 15,
            s & x, ~s, s >> 1, one ^ x, ~one, empty & empty, empty >> 2, ~empty,
            t & row, t >> 2, ~t, t << (row & 3), x & (x > 0))


def run(fn, inputs, device):
    program = strata.compile(fn, inputs, device=device)
    with torch.no_grad():
        got, want = program(*inputs), fn(*inputs)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"output {k}: {g.dtype} {tuple(g.shape)}"
        assert torch.equal(g, w), f"output {k}: {g.tolist()} != torch's {w.tolist()}"
    return program


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_op_matches_torch(dtype, device):
    inputs = (ints(7, dtype=dtype), ints(7, dtype=dtype), counts(7, dtype=dtype),
              ints(dtype=dtype), ints(1, dtype=dtype), ints(0, dtype=dtype),
              ints(5, 3, dtype=dtype).t(), ints(5, dtype=dtype))
    assert not inputs[6].is_contiguous()
    run(every_op, inputs, device)


@pytest.mark.parametrize("device", DEVICES)
def test_promotion_as_torch(device):
    """uint8 & int literal stays uint8, uint8 & int8 is int16, bool & bool stays logic, bool &
    int literal is int64, int8 shifted by an int64 tensor is int64."""
    u8, i8 = ints(7, dtype=torch.uint8), ints(7, dtype=torch.int8)
    flags, n64 = u8 > 100, counts(7, dtype=torch.int64)

    def fn(u8, i8, flags, n64):
        return u8 & 300, u8 & i8, u8 ^ i8, flags & (i8 > 0), flags | flags, ~flags, flags & 3, \
            i8 >> n64, u8 << n64
    run(fn, (u8, i8, flags, n64), device)


@pytest.mark.parametrize("device", DEVICES)
def test_q4_0_unpack(device):
    """The nibble unpack of Q4_0 blocks (strata/quant/formats.py)."""
    qs = ints(5, 3, 16, dtype=torch.uint8)
    run(lambda qs: (torch.cat([qs & 15, qs >> 4], -1).to(torch.float32) - 8,), (qs,), device)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_q4_0_quant_linear_on_cpu():
    module = QuantLinear.from_linear(torch.nn.Linear(96, 40), "q4_0")
    x = torch.randn(3, 96)
    program = strata.compile(module, (x,), device="cpu")
    with torch.no_grad():
        got, want = program(x), module(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def one_kernel(dtype):
    """A program of one kernel (GPU schedule) doing every bit op, and its inputs."""
    def fn(x, y, n):
        return (~x ^ y) | ((x << n) & (y >> 3)) ^ (x >> n)
    inputs = (ints(7, dtype=dtype), ints(7, dtype=dtype), counts(7, dtype=dtype))
    program = strata.compile(fn, inputs, until="cuda")
    assert len(program.kernels) == 1
    return program, fn, inputs


def test_cuda_and_hip_sources_compile_with_nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC (cuda-bindings) is not installed, "
                        "so the CUDA source of a bitwise kernel cannot be compiled here")
    from strata.runtime.nvrtc import compile_cuda
    from strata.codegen import hip
    hip_on_cuda = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
                   "typedef __nv_bfloat16 __hip_bfloat16;")
    for dtype in DTYPES:
        program = one_kernel(dtype)[0]
        source = program.source("cuda")
        assert "<<" in source and "~" in source and ">>" in source
        compile_cuda(source, "sm_80", want="ptx")
        source = hip.emit_source(program.kernels).replace(hip.HEADER, hip_on_cuda)
        compile_cuda(source, "sm_80", want="ptx")


def test_metal_prints_its_own_type_names():
    """Metal inherits C's printing through OpenCL's emitter (xcrun metal is not here)."""
    from strata.codegen import metal
    for dtype in DTYPES:
        text = metal.emit_source(one_kernel(dtype)[0].kernels)
        assert "long long" not in text and "~" in text and "<<" in text, text


def _opencl_device() -> bool:
    try:
        import pyopencl as cl
        return any(p.get_devices() for p in cl.get_platforms())
    except Exception:            # not installed, or no driver (ICD) to list
        return False


@pytest.mark.skipif(not _opencl_device(), reason="pyopencl finds no OpenCL device (PoCL gives "
                    "a CPU one), so the OpenCL source of a bitwise kernel cannot be run here")
def test_opencl_runs_the_kernel_as_torch():
    from strata.dsl.kernel import run_opencl
    for dtype in DTYPES:
        program, fn, inputs = one_kernel(dtype)
        (k,) = program.kernels
        out = torch.zeros(7, dtype=dtype)
        run_opencl(k, {**dict(zip(["x", "y", "n"], inputs)), k.params[-1].name: out}, {})
        assert torch.equal(out, fn(*inputs)), f"{dtype}: {out.tolist()} != {fn(*inputs).tolist()}"
