"""llama.cpp's K-quants (Q4_K, Q6_K) as GGUF stores them: super-blocks of 256 weights.

Why: the GGUF files people download are Q4_K_M (Q4_K tensors, Q6_K for the output and half the
down projections). Loading dequantizes them with the gguf package (the reference); this module
writes them, so that tests and benchmarks make such files without a download: round-to-nearest
scales, not llama.cpp's searched ones (its quantizer makes smaller errors; the bytes follow the
same layout, which the tests check against gguf.quants.dequantize).

  Q4_K  144 bytes: d, dmin (fp16); 12 bytes of eight 6-bit scales and eight 6-bit mins, one per
        32 weights; 128 bytes of 4-bit q. w = d * scale * q - dmin * min.
  Q6_K  210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, sixteen int8 scales (one per 16
        weights), d (fp16). w = d * scale * (q - 32).
"""
from __future__ import annotations

import numpy as np

QK_K = 256
BYTES = {"Q4_K": 144, "Q6_K": 210}


def _blocks(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % QK_K:
        raise ValueError(f"K-quants take rows of whole {QK_K}-weight blocks, not shape {w.shape}")
    return w.reshape(-1, QK_K)


def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """(N, K) floats -> (N, K / 256 * 144) uint8, as GGUF's Q4_K."""
    rows = w.shape[0]
    x = _blocks(w).reshape(-1, 8, 32)
    lo = np.minimum(x.min(-1), 0.0)
    scale, mins = (x.max(-1) - lo) / 15, -lo                     # per 32: w = scale * q - min
    d = _fp16(scale.max(-1) / 63)
    dmin = _fp16(mins.max(-1) / 63)
    dd, dm = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, dd, out=np.zeros_like(scale), where=dd > 0)), 0, 63)
    mn = np.clip(np.rint(np.divide(mins, dm, out=np.zeros_like(mins), where=dm > 0)), 0, 63)
    step, low = (dd * sc)[..., None], (dm * mn)[..., None]
    q = np.clip(np.rint(np.divide(x + low, step, out=np.zeros_like(x), where=step > 0)), 0, 15)
    sc, mn, q = sc.astype(np.uint8), mn.astype(np.uint8), q.astype(np.uint8)
    packed = np.empty((len(x), 12), np.uint8)                    # get_scale_min_k4's layout
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    pairs = q.reshape(-1, 4, 2, 32)                               # 64 weights: low then high nibbles
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                          packed, qs], axis=1)
    return out.reshape(rows, -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """(N, K) floats -> (N, K / 256 * 210) uint8, as GGUF's Q6_K."""
    rows = w.shape[0]
    x = _blocks(w).reshape(-1, 16, 16)
    at = np.abs(x).argmax(-1)[..., None]                          # the largest maps to q - 32 = -32
    scale = -np.take_along_axis(x, at, -1)[..., 0] / 32           # per 16: w = scale * (q - 32)
    d = _fp16(np.abs(scale).max(-1) / 127)
    dd = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, dd, out=np.zeros_like(scale), where=dd > 0)), -127, 127)
    step = (dd * sc)[..., None]
    q = np.clip(np.rint(np.divide(x, step, out=np.zeros_like(x), where=step != 0)), -32, 31) + 32
    q = q.astype(np.uint8).reshape(-1, 2, 4, 32)                 # halves of 128: four runs of 32
    ql = np.concatenate([q[:, :, 0] & 15 | (q[:, :, 2] & 15) << 4,
                         q[:, :, 1] & 15 | (q[:, :, 3] & 15) << 4], axis=2).reshape(-1, 128)
    qh = (q[:, :, 0] >> 4 | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4
          | (q[:, :, 3] >> 4) << 6).reshape(-1, 64)
    out = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8),
                          d.view(np.uint8).reshape(-1, 2)], axis=1)
    return out.reshape(rows, -1)
