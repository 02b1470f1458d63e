"""The simulator's meaning of each CPU instruction form (kernel_ir/cpu_ir.py), looked up by class.

A form's loop as written is its meaning up to the order of float sums and bf16 subnormals, so
most forms run as their loop. A QuantRow with `vnni` is not: the CPU rounds the row's activations
to int8 blocks of 32 first (d = max|x| / 127, q = round(x / d), as the C prelude's
st_quantize_*), an error of its own (0.6% of the norm, llama.cpp's), so the simulator runs the
loop on those rounded activations (q * d, exact in f32), which is what the CPU computes up to the
order of its sums.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .cpu_ir import AmxTiles, DotBf16, LaneSum, OuterFma, PairsBf16, QuantRow, QuantRows
from .sim_memory import from_storage


def as_written(batch, s, idx) -> None:
    batch.run_for(s, idx)


def quant_row(batch, s: QuantRow, idx) -> None:
    if not s.vnni:
        return batch.run_for(s, idx)
    launch = batch.launch
    param, stored = launch.params[s.x], launch.memory[s.x]
    launch.params[s.x], launch.memory[s.x] = replace(param, dtype="f32"), int8_blocks(
        from_storage(stored, param.dtype))
    try:
        batch.run_for(s, idx)
    finally:
        launch.params[s.x], launch.memory[s.x] = param, stored


def int8_blocks(x: np.ndarray) -> np.ndarray:
    """x (f32, whole blocks of 32 first, any rest left as it is) rounded as the CPU's int8 rows
    see it."""
    n = x.size // 32 * 32
    blocks = x[:n].reshape(-1, 32).astype(np.float32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(blocks * inv)
    return np.concatenate([(q * d).reshape(-1), x[n:].astype(np.float32)])


MEANINGS = {DotBf16: as_written, PairsBf16: as_written, AmxTiles: as_written, OuterFma: as_written,
            QuantRow: quant_row, QuantRows: as_written, LaneSum: as_written}
