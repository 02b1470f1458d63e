"""Storage for the simulator: how each dtype is held in memory, poisoned, loaded and stored.

Global buffers are flat NumPy arrays of the *storage* type (bf16 as uint16 bit patterns, see
`dtypes.to_bf16_bits`, FP8 as uint8 ones); values in flight are in the *compute* type: float32
for f32/f16/bf16/FP8 (the GPU's fp32, never float64), float64 for f64, int64 for every integer
type, bool for bool.
Kept apart from sim.py so that the runtime and tests can build and read buffers the same way.
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes
from ..core.expr import cast_values


def storage_numpy(dtype: str):
    """NumPy type of one stored element of `dtype` (bf16 -> uint16 bit patterns, FP8 -> uint8)."""
    return np.uint16 if dtype == "bf16" else np.uint8 if dtype in dtypes.FLOAT8 \
        else dtypes.to_numpy(dtype)


def compute_numpy(dtype: str):
    """NumPy type a value of `dtype` is computed in (f16/bf16 -> float32, ints -> int64)."""
    if dtype == "f32" or dtype in dtypes.NARROW:
        return np.float32
    if dtype == "f64":
        return np.float64
    if dtype == "bool":
        return np.bool_
    return np.int64


def poison(dtype: str, numel: int) -> np.ndarray:
    """A storage array whose every element says 'never written': NaN for floats, the most
    negative value for signed ints, the largest for unsigned ones (bool cannot be poisoned)."""
    if dtype == "bf16":
        return np.full(numel, 0x7FC0, dtype=np.uint16)
    if dtype in dtypes.FLOAT8:
        return np.full(numel, 0x7F, dtype=np.uint8)          # NaN in both formats
    t = storage_numpy(dtype)
    if dtypes.is_float(dtype):
        return np.full(numel, np.nan, dtype=t)
    if dtype == "bool":
        return np.zeros(numel, dtype=np.bool_)
    info = np.iinfo(t)
    return np.full(numel, info.min if info.min < 0 else info.max, dtype=t)


def to_storage(values, dtype: str) -> np.ndarray:
    """Compute (or user) values -> storage elements, rounding like a GPU store does."""
    v = np.asarray(values)
    if dtype == "bf16":
        return dtypes.to_bf16_bits(v)
    if dtype in dtypes.FLOAT8:
        return dtypes.to_f8_bits(v, dtype)
    if dtype == "f16":
        return v.astype(np.float16)          # float32 -> float16 rounds to nearest even
    if dtype in ("f32", "f64"):
        return v.astype(storage_numpy(dtype), copy=False)
    return cast_values(v, dtype)


def from_storage(stored: np.ndarray, dtype: str) -> np.ndarray:
    """Storage elements -> compute values (what a Load yields)."""
    if dtype == "bf16":
        return dtypes.from_bf16_bits(stored)
    if dtype in dtypes.FLOAT8:
        return dtypes.from_f8_bits(stored, dtype)
    return stored.astype(compute_numpy(dtype), copy=False)


def to_user(stored: np.ndarray, dtype: str) -> np.ndarray:
    """Storage elements -> the values `simulate` hands back (bf16 and FP8 as float32 values)."""
    if dtype == "bf16":
        return dtypes.from_bf16_bits(stored)
    if dtype in dtypes.FLOAT8:
        return dtypes.from_f8_bits(stored, dtype)
    return stored.copy()


def convert(values, dtype: str) -> np.ndarray:
    """C-like conversion of values to the compute representation of `dtype`."""
    v = np.asarray(values)
    t = compute_numpy(dtype)
    if v.dtype == t and dtype in ("f32", "f64", "i64", "bool"):
        return v
    return np.asarray(cast_values(v, dtype)).astype(t, copy=False)
