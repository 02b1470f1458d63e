"""The element types strata knows, and how each maps to torch, NumPy and C.

One short name per type is used in every IR ("f32", "bf16", "i64", "bool"); this module is the
only place that translates it. bf16 has no NumPy type: NumPy code holds bf16 *values* as float32
and bf16 *storage* (simulator buffers) as uint16 bit patterns, see `to_bf16_bits`. The FP8 types
(torch's float8_e4m3fn and float8_e5m2) are held the same way: values as float32, storage as
uint8 bit patterns, rounded as torch rounds them (`to_f8_bits`).
"""
from __future__ import annotations

import numpy as np

from .errors import UnsupportedDtype

FLOAT8 = ("f8e4m3", "f8e5m2")
NARROW = ("f16", "bf16") + FLOAT8       # stored narrow, computed in f32
FLOATS = ("f32", "f16", "bf16", "f64") + FLOAT8
INTS = ("i64", "i32", "i16", "i8", "u8")
ALL = FLOATS + INTS + ("bool",)

_TORCH_NAMES = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "bool": "bool",
    "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
}
_NUMPY = {
    "f32": np.float32, "f16": np.float16, "bf16": np.float32, "f64": np.float64,
    "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8, "u8": np.uint8,
    "bool": np.bool_, "f8e4m3": np.float32, "f8e5m2": np.float32,
}
# Storage type in CUDA C for a global buffer of this dtype.
C_STORAGE = {
    "f32": "float", "f16": "__half", "bf16": "__nv_bfloat16", "f64": "double",
    "i64": "long long", "i32": "int", "i16": "short", "i8": "signed char", "u8": "unsigned char",
    "bool": "bool", "f8e4m3": "unsigned char", "f8e5m2": "unsigned char",   # st_f8* convert
}
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "i16": 2, "i8": 1,
            "u8": 1, "bool": 1, "f8e4m3": 1, "f8e5m2": 1}


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def compute_dtype(dtype: str) -> str:
    """The type arithmetic on values of `dtype` runs in: fp16/bf16/fp8 compute in fp32."""
    return "f32" if dtype in NARROW else dtype


def from_torch(torch_dtype) -> str:
    name = str(torch_dtype).replace("torch.", "")
    for short, long in _TORCH_NAMES.items():
        if long == name:
            return short
    raise UnsupportedDtype(torch_dtype)


def to_torch(dtype: str):
    import torch
    return getattr(torch, _TORCH_NAMES[dtype])


def to_numpy(dtype: str):
    """NumPy type used to hold *values* of `dtype` (bf16 values are held in float32)."""
    return _NUMPY[dtype]


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round values to what `dtype` can represent, returned in the NumPy value type."""
    if dtype == "bf16":
        return from_bf16_bits(to_bf16_bits(values))
    if dtype in FLOAT8:
        return from_f8_bits(to_f8_bits(values, dtype), dtype)
    if dtype == "bool":
        return np.asarray(values).astype(np.bool_)
    if is_int(dtype):
        return np.trunc(np.asarray(values)).astype(_NUMPY[dtype]) if np.asarray(values).dtype.kind == "f" \
            else np.asarray(values).astype(_NUMPY[dtype])
    return np.asarray(values).astype(_NUMPY[dtype])


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float -> bf16 bit patterns (uint16), round to nearest even, NaN kept NaN."""
    f = np.asarray(values, dtype=np.float32)
    # (ascontiguousarray makes a 0-d array 1-d: reshape back)
    bits = np.ascontiguousarray(f).view(np.uint32).astype(np.uint64).reshape(f.shape)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out = np.where(nan, np.uint16(0x7FC0), out)
    return out


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32 values."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_f8_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float -> FP8 bit patterns (uint8) as torch converts float32: round to nearest even; e4m3fn
    has no infinity (torch saturates what rounds past 448, infinity too, to 448), e5m2 overflows
    to infinity; NaN stays NaN."""
    import torch
    f = torch.from_numpy(np.array(values, dtype=np.float32))
    return f.to(to_torch(dtype)).view(torch.uint8).numpy().reshape(np.shape(values))


def from_f8_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    """FP8 bit patterns (uint8) -> float32 values (exact)."""
    import torch
    b = torch.from_numpy(np.array(bits, dtype=np.uint8))
    return b.view(to_torch(dtype)).float().numpy().reshape(np.shape(bits))
