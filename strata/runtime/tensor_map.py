"""Host side of TMA: the cuTensorMapEncodeTiled call that turns a Kernel IR TensorMap parameter
plus its buffer's device address into the 128-byte CUtensorMap the kernel takes by value
(`const __grid_constant__`).

Why apart: `encode_args` builds the exact arguments, checked against the CUDA API's limits, as
plain values (enum member *names*), so they are unit-tested without a GPU; `encode` alone
touches cuda.bindings (imported lazily, through runtime/driver.py's checked `call`).
Out-of-bounds elements are filled with zeros (OOB_FILL_NONE), as the simulator does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import dtypes
from ..core.errors import CudaError
from ..kernel_ir.ir import SWIZZLE_BYTES, Param
from . import driver as default_driver

DATA_TYPES = {"bf16": "BFLOAT16", "f16": "FLOAT16", "f32": "FLOAT32", "f64": "FLOAT64",
              "i32": "INT32", "i64": "INT64", "u8": "UINT8", "f8e4m3": "UINT8", "f8e5m2": "UINT8"}
SWIZZLE = {"none": "NONE", "32B": "32B", "64B": "64B", "128B": "128B"}
L2_PROMOTION = "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"


@dataclass(frozen=True)
class EncodeArgs:
    """The arguments of cuTensorMapEncodeTiled, in its order (enums by member name)."""
    data_type: str
    rank: int
    address: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: str
    swizzle: str
    l2_promotion: str
    oob_fill: str


def encode_args(param: Param, address: int) -> EncodeArgs:
    """What encode() passes for `param` at device address `address`; raises CudaError, one
    sentence, where the CUDA API would refuse it."""
    tm = param.tensor_map
    name = param.name

    def bad(what: str):
        raise CudaError(f"tensor map {name}: {what}")
    if tm is None:
        bad("the parameter is passed as a pointer, not a tensor map")
    if param.dtype not in DATA_TYPES:
        bad(f"TMA has no element type for {param.dtype}")
    item = dtypes.ITEMSIZE[param.dtype]
    rank = len(tm.dims)
    if not 1 <= rank <= 5 or len(tm.box) != rank or len(tm.strides) != rank - 1:
        bad(f"rank {rank} with box {list(tm.box)} and strides {list(tm.strides)}")
    if address % 16:
        bad(f"the global address {address:#x} is not 16-byte aligned")
    if any(not 1 <= d <= 2 ** 32 for d in tm.dims):
        bad(f"dims {list(tm.dims)} not in 1..2^32")
    if any(s % 16 or not 0 < s < 2 ** 40 for s in tm.strides):
        bad(f"strides {list(tm.strides)} are not positive multiples of 16 bytes below 2^40")
    if any(not 1 <= b <= 256 for b in tm.box):
        bad(f"box {list(tm.box)} has a side outside 1..256")
    inner = tm.box[0] * item
    if inner % 16:
        bad(f"the inner box side is {inner} bytes, not a multiple of 16")
    if SWIZZLE_BYTES.get(tm.swizzle, -1) < 0:
        bad(f"unknown swizzle {tm.swizzle!r}")
    if SWIZZLE_BYTES[tm.swizzle] and inner > SWIZZLE_BYTES[tm.swizzle]:
        bad(f"the inner box side is {inner} bytes, more than the {tm.swizzle} swizzle span")
    return EncodeArgs(f"CU_TENSOR_MAP_DATA_TYPE_{DATA_TYPES[param.dtype]}", rank, int(address),
                      tuple(tm.dims), tuple(tm.strides), tuple(tm.box), (1,) * rank,
                      "CU_TENSOR_MAP_INTERLEAVE_NONE", f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLE[tm.swizzle]}",
                      L2_PROMOTION, "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")


def encode(param: Param, address: int, driver=None) -> np.ndarray:
    """The CUtensorMap of `param` at `address`: 16 uint64 (128 bytes) for the kernel parameter."""
    drv = driver or default_driver
    a = encode_args(param, address)
    cu = drv._cu()
    u32 = lambda xs: [cu.cuuint32_t(x) for x in xs]     # cuda-bindings 13.3 takes no plain ints
    u64 = lambda xs: [cu.cuuint64_t(x) for x in xs]     # here (13.5 converts them itself)
    tmap = drv.call("cuTensorMapEncodeTiled",
                    getattr(cu.CUtensorMapDataType, a.data_type), cu.cuuint32_t(a.rank), a.address,
                    u64(a.dims), u64(a.strides), u32(a.box), u32(a.element_strides),
                    getattr(cu.CUtensorMapInterleave, a.interleave),
                    getattr(cu.CUtensorMapSwizzle, a.swizzle),
                    getattr(cu.CUtensorMapL2promotion, a.l2_promotion),
                    getattr(cu.CUtensorMapFloatOOBfill, a.oob_fill),
                    detail=f" for tensor map {param.name}")
    return np.array([int(x) for x in tmap.opaque], dtype=np.uint64)
