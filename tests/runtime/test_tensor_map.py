"""The host side of TMA without a GPU: the cuTensorMapEncodeTiled arguments built from a Kernel IR
tensor-map parameter, the CUDA API's limits as one-sentence errors, and the launch packing that
passes the 128-byte map by value."""
import numpy as np
import pytest

from strata.core.errors import CudaError
from strata.kernel_ir.ir import Param, TensorMap
from strata.runtime.launch import PackedArgs
from strata.runtime.tensor_map import encode, encode_args


def param(dims=(4096, 1000), strides=(8192,), box=(64, 64), swizzle="128B", dtype="bf16"):
    return Param("A", dtype, dims[0] * dims[1], tensor_map=TensorMap(dims, strides, box, swizzle))


def test_encode_args():
    a = encode_args(param(), 0x7f0000001000)
    assert a.data_type == "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16" and a.rank == 2
    assert a.address == 0x7f0000001000
    assert (a.dims, a.strides, a.box, a.element_strides) == ((4096, 1000), (8192,), (64, 64), (1, 1))
    assert a.swizzle == "CU_TENSOR_MAP_SWIZZLE_128B" and a.interleave == "CU_TENSOR_MAP_INTERLEAVE_NONE"
    assert a.oob_fill == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"
    f = encode_args(param(box=(8, 16), swizzle="none", dtype="f32", strides=(16384,)), 256)
    assert f.data_type == "CU_TENSOR_MAP_DATA_TYPE_FLOAT32" and f.swizzle == "CU_TENSOR_MAP_SWIZZLE_NONE"


def test_enum_names_exist_in_cuda_bindings():
    driver = pytest.importorskip("cuda.bindings.driver")
    a = encode_args(param(), 0)
    getattr(driver.CUtensorMapDataType, a.data_type)
    getattr(driver.CUtensorMapSwizzle, a.swizzle)
    getattr(driver.CUtensorMapInterleave, a.interleave)
    getattr(driver.CUtensorMapL2promotion, a.l2_promotion)
    getattr(driver.CUtensorMapFloatOOBfill, a.oob_fill)


@pytest.mark.parametrize("kw, address, msg", [
    ({}, 8, "global address 0x8 is not 16-byte aligned"),
    (dict(strides=(8200,)), 0, "not positive multiples of 16 bytes"),
    (dict(box=(64, 300)), 0, "a side outside 1..256"),
    (dict(box=(128, 64)), 0, "256 bytes, more than the 128B swizzle span"),
    (dict(box=(4, 64), swizzle="none"), 0, "8 bytes, not a multiple of 16"),
])
def test_limits(kw, address, msg):
    with pytest.raises(CudaError, match=msg):
        encode_args(param(**kw), address)
    with pytest.raises(CudaError, match="passed as a pointer"):
        encode_args(Param("x", "f32", 4), 0)


class FakeDriver:
    """Records the cuTensorMapEncodeTiled call and returns a recognisable map."""

    def __init__(self):
        self.calls = []

    def _cu(self):
        return pytest.importorskip("cuda.bindings.driver")

    def call(self, name, *args, detail=""):
        self.calls.append((name, args))

        class Map:
            opaque = list(range(100, 116))
        return Map()


def test_encode_calls_the_driver_and_launch_packs_by_value():
    fake = FakeDriver()
    blob = encode(param(), 4096, driver=fake)
    name, args = fake.calls[0]
    cu = fake._cu()
    plain = lambda v: [int(x) for x in v] if isinstance(v, list) else int(v)
    assert name == "cuTensorMapEncodeTiled" and [plain(a) for a in args[1:7]] == \
        [2, 4096, [4096, 1000], [8192], [64, 64], [1, 1]]
    # the sized integer types themselves: cuda-bindings 13.3 (the GPU machine's) refuses plain
    # ints ("Cannot convert int to cuda.bindings.driver.cuuint32_t"), found on an H100
    assert isinstance(args[1], cu.cuuint32_t)
    assert all(isinstance(x, cu.cuuint64_t) for x in args[3] + args[4])
    assert all(isinstance(x, cu.cuuint32_t) for x in args[5] + args[6])
    assert blob.dtype == np.uint64 and blob.tolist() == list(range(100, 116))
    packed = PackedArgs([0x1000, blob, 0x2000])
    assert packed.values.tolist() == [0x1000, 0, 0x2000]
    assert packed.slots.tolist() == [packed.values.ctypes.data, blob.ctypes.data,
                                     packed.values.ctypes.data + 16]
