"""Tensor-core warp instructions in the simulator: ldmatrix and mma.sync m16n8k16 (f16/bf16 in,
f32 accumulators), with the PTX ISA's fragment layouts, so that a wrong lane mapping in a
kernel gives wrong numbers here exactly as it would on the GPU.

Both instructions are warp-collective: every lane of each warp that reaches one must be active
(the sanitizer fails otherwise, as for a shuffle). A fragment register is an i32 variable
holding the 32 bits of two 16-bit elements, the lower-numbered element in the low half.

Layouts, with g = lane >> 2 (groupID) and t = lane % 4 (threadID_in_group):
  A (16x16, row): register r, half h holds a_(2r+h) at row g + 8 * (r & 1), col 2t + h + 8 * (r >> 1)
  B (16x8, col):  register r, half h holds b_(2r+h) at row 2t + h + 8 * r,   col g
  C, D (16x8):    c_i at row g + 8 * (i >> 1), col 2t + (i & 1)
  ldmatrix:       register i holds matrix i's (g, 2t + h), or (2t + h, g) with .trans, where
                  row r of matrix i starts at the address given by lane 8 * i + r.

The sanitizer counts ldmatrix's shared reads as made by the lanes that *receive* the elements,
so data written by other threads, even of the same warp, needs a Sync first.

Accumulation: the products of f16 or bf16 inputs are exact in f32; they are added to C one k at
a time in increasing k, each sum rounded to f32 (what `acc += a * b` does). The hardware's order
and intermediate precision within one mma are not specified, so tests compare GPU and
simulator with a tolerance.
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes
from .ir import LdMatrix, Mma, PackHalf2
from .sim_memory import to_storage

_LANE = np.arange(32)
_G, _T = _LANE >> 2, _LANE & 3
_REG4 = np.arange(4)[:, None, None]
_REG2 = np.arange(2)[:, None, None]
_HALF = np.arange(2)[None, :, None]

# [register, half, lane] -> (row, col) of the element a lane holds
A_ROW = np.broadcast_to(_G + 8 * (_REG4 & 1), (4, 2, 32))
A_COL = np.broadcast_to(2 * _T + _HALF + 8 * (_REG4 >> 1), (4, 2, 32))
B_ROW = np.broadcast_to(2 * _T + _HALF + 8 * _REG2, (2, 2, 32))
B_COL = np.broadcast_to(_G, (2, 2, 32))
# [index, lane] -> (row, col) of accumulator element c_index
C_ROW = _G + 8 * (np.arange(4)[:, None] >> 1)
C_COL = 2 * _T + (np.arange(4)[:, None] & 1)


def unpack(regs: np.ndarray, dtype: str) -> np.ndarray:
    """i32 registers -> their two 16-bit elements as float32 values, on a new last axis
    (low half first)."""
    bits = np.asarray(regs, dtype=np.int64) & 0xFFFFFFFF
    halves = np.stack([bits & 0xFFFF, bits >> 16], axis=-1).astype(np.uint16)
    if dtype == "bf16":
        return dtypes.from_bf16_bits(halves)
    return halves.view(np.float16).astype(np.float32)


def pack(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Two arrays of 16-bit patterns -> i32 registers (as int64 values, like every i32 var)."""
    bits = np.asarray(low, dtype=np.uint32) | (np.asarray(high, dtype=np.uint32) << 16)
    return bits.astype(np.uint32).view(np.int32).astype(np.int64)


def mma_m16n8k16(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: str) -> np.ndarray:
    """D = A @ B + C for W warps at once: a (W, 4, 32) and b (W, 2, 32) registers, c (W, 4, 32)
    float32; returns d like c."""
    w = a.shape[0]
    A = np.empty((w, 16, 16), np.float32)
    B = np.empty((w, 16, 8), np.float32)
    acc = np.empty((w, 16, 8), np.float32)
    A[:, A_ROW, A_COL] = np.moveaxis(unpack(a, dtype), -1, 2)
    B[:, B_ROW, B_COL] = np.moveaxis(unpack(b, dtype), -1, 2)
    acc[:, C_ROW, C_COL] = c
    for k in range(16):
        acc += A[:, :, k, None] * B[:, None, k, :]
    return acc[:, C_ROW, C_COL]


def ldmatrix_index(rows: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """Row addresses (W, 32) -> [matrix, half, warp, lane] element index each lane receives."""
    i = np.arange(num)[:, None, None]
    h = np.arange(2)[None, :, None]
    if trans:
        src_lane, col = 8 * i + 2 * _T + h, _G
    else:
        src_lane, col = 8 * i + _G, 2 * _T + h
    src_lane, col = np.broadcast_arrays(src_lane, col)          # (num, 2, 32)
    return np.moveaxis(rows[:, src_lane] + col, 0, 2)            # (num, 2, W, 32)


# ---------------------------------------------------------------- statements

def run_ldmatrix(batch, s: LdMatrix, idx) -> None:
    num = len(s.vars)
    batch.check_whole_warps(idx, "ldmatrix", "execute it")
    sh = batch.smem.get(s.buf)
    if sh is None:
        batch.launch.fail(f"ldmatrix from {s.buf}, which is not a shared array")
    lanes = batch.lanes(idx).reshape(-1, 32)        # whole warps, ascending: one row per warp
    rows = batch.ints(batch.eval(s.row, idx), idx).reshape(-1, 32)
    given, who = rows[:, :8 * num], lanes[:, :8 * num]
    bad = given % 8 != 0
    if bad.any():
        j = np.flatnonzero(bad)[0]
        batch.launch.fail(f"ldmatrix row {s.buf}[{given.flat[j]}] is not 16-byte aligned (index "
                          f"not a multiple of 8) by {batch.who(who.flat[j])}")
    bad = (given < 0) | (given + 8 > sh.decl.size)
    if bad.any():
        j = np.flatnonzero(bad)[0]
        batch.launch.fail(f"out-of-bounds ldmatrix row {s.buf}[{given.flat[j]}:"
                          f"{given.flat[j] + 8}] (size {sh.decl.size}) by {batch.who(who.flat[j])}")
    index = ldmatrix_index(rows, num, s.trans)
    for m, var in enumerate(s.vars):
        halves = [to_storage(batch.load(s.buf, index[m, h].reshape(-1), idx, what="ldmatrix"),
                             sh.decl.dtype).view(np.uint16) for h in (0, 1)]
        batch.set_var(var, "i32", pack(*halves), idx)


def run_pack(batch, s: PackHalf2, idx) -> None:
    """Both values rounded to the 16-bit dtype as a store would, packed lo | hi << 16."""
    halves = [to_storage(np.broadcast_to(np.asarray(batch.eval(e, idx), np.float32),
                                         (batch.count(idx),)), s.dtype).view(np.uint16)
              for e in (s.lo, s.hi)]
    batch.set_var(s.var, "i32", pack(*halves), idx)


def run_mma(batch, s: Mma, idx) -> None:
    batch.check_whole_warps(idx, "mma", "execute it")

    def regs(names):
        for n in names:
            if n not in batch.env:
                batch.launch.fail(f"mma reads {n} before it is set")
        return np.stack([batch.env[n] if idx is None else batch.env[n][idx] for n in names], axis=1)
    d = mma_m16n8k16(_by_warp(regs(s.a)), _by_warp(regs(s.b)),
                     _by_warp(regs(s.c)).astype(np.float32), s.dtype)
    for r, var in enumerate(s.d):
        batch.set_var(var, "f32", d[:, r, :].reshape(-1), idx)


def _by_warp(values: np.ndarray) -> np.ndarray:
    """(lanes, k) per-lane values -> (warps, k, 32)."""
    return values.reshape(-1, 32, values.shape[1]).transpose(0, 2, 1)
