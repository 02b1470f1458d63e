"""llama.cpp's K-quants (Q4_K, Q5_K, Q6_K) as GGUF stores them: super-blocks of 256 weights.

Why: the GGUF files people download are Q4_K_M (Q4_K tensors, Q6_K for the output and half the
down projections) and Q5_K_M (Q5_K and Q6_K). Loading dequantizes them with the gguf package
(the reference); this module writes them (ROWS), so that tests and benchmarks make such files
without a download: round-to-nearest scales, not llama.cpp's searched ones (its quantizer makes
smaller errors; the bytes follow the same layout, which the tests check against
gguf.quants.dequantize).

  Q4_K  144 bytes: d, dmin (fp16); 12 bytes of eight 6-bit scales and eight 6-bit mins, one per
        32 weights; 128 bytes of 4-bit q. w = d * scale * q - dmin * min.
  Q5_K  176 bytes: Q4_K's 16 bytes of d, dmin, scales and mins; 32 bytes of fifth bits (weight l
        of each 32 at bit b of byte l, b its block of 32); Q4_K's 128 bytes of low 4 bits.
  Q6_K  210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, sixteen int8 scales (one per 16
        weights), d (fp16). w = d * scale * (q - 32).
"""
from __future__ import annotations

import torch

QK_K = 256
BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _blocks(w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 2 or w.shape[1] % QK_K:
        raise ValueError(f"K-quants take rows of whole {QK_K}-weight blocks, not shape {tuple(w.shape)}")
    return w.float().reshape(-1, QK_K)


def _over(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b where b is not 0, else 0 (an all-zero block)."""
    return torch.where(b != 0, a / torch.where(b != 0, b, 1), 0)


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """An fp16 vector as its bytes, two a value."""
    return x.contiguous().view(torch.uint8).reshape(-1, 2)


def q4_k_rows(w: torch.Tensor, top: int = 15) -> torch.Tensor:
    """(N, K) floats -> (N, K / 256 * 144) uint8, as GGUF's Q4_K (torch ops: fake tensors too);
    with top = 31, (N, K / 256 * 176) as GGUF's Q5_K."""
    rows = w.shape[0]
    x = _blocks(w).reshape(-1, 8, 32)
    lo = x.amin(-1).clamp(max=0.0)
    scale, mins = (x.amax(-1) - lo) / top, -lo                    # per 32: w = scale * q - min
    d, dmin = (scale.amax(-1) / 63).half(), (mins.amax(-1) / 63).half()
    dd, dm = d.float()[:, None], dmin.float()[:, None]
    sc = _over(scale, dd).round().clamp(0, 63)                   # round half to even, as np.rint
    mn = _over(mins, dm).round().clamp(0, 63)
    step, low = (dd * sc)[..., None], (dm * mn)[..., None]
    q = _over(x + low, step).round().clamp(0, top).to(torch.uint8)
    sc, mn = sc.to(torch.uint8), mn.to(torch.uint8)
    packed = torch.cat([sc[:, :4] | ((sc[:, 4:] >> 4) << 6),      # get_scale_min_k4's layout
                        mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
                        (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)], 1)
    pairs = (q & 15).reshape(-1, 4, 2, 32)                        # 64 weights: low then high nibbles
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    fifth = [(q[:, b] >> 4) << b for b in range(8)] if top == 31 else []
    qh = [sum(fifth[1:], fifth[0])] if fifth else []              # Q5_K: bit b of byte l
    return torch.cat([_bytes(d), _bytes(dmin), packed, *qh, qs], 1).reshape(rows, -1)


def q6_k_rows(w: torch.Tensor) -> torch.Tensor:
    """(N, K) floats -> (N, K / 256 * 210) uint8, as GGUF's Q6_K (torch ops: fake tensors too)."""
    rows = w.shape[0]
    x = _blocks(w).reshape(-1, 16, 16)
    at = x.abs().argmax(-1, keepdim=True)                         # the largest maps to q - 32 = -32
    scale = -x.gather(-1, at)[..., 0] / 32                        # per 16: w = scale * (q - 32)
    d = (scale.abs().amax(-1) / 127).half()
    dd = d.float()[:, None]
    sc = _over(scale, dd).round().clamp(-127, 127)
    step = (dd * sc)[..., None]
    q = (_over(x, step).round().clamp(-32, 31) + 32).to(torch.uint8).reshape(-1, 2, 4, 32)
    ql = torch.cat([q[:, :, 0] & 15 | (q[:, :, 2] & 15) << 4,     # halves of 128: four runs of 32
                    q[:, :, 1] & 15 | (q[:, :, 3] & 15) << 4], 2).reshape(-1, 128)
    qh = (q[:, :, 0] >> 4 | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4
          | (q[:, :, 3] >> 4) << 6).reshape(-1, 64)
    return torch.cat([ql, qh, sc.to(torch.int8).view(torch.uint8), _bytes(d)], 1).reshape(rows, -1)


# How strata holds a K-quant weight: the file's blocks split into tensors (QuantLinear buffers)
# whose dequantization is a few torch ops that strata fuses into the product reading them, in
# blocks of 32 or 16 weights as Q8_0/Q4_0's (cpu_block_loops, codegen/c_qdot.py). Both are bit-exact
# with gguf.quants.dequantize: the same products in the same order.
#   q4_k  qs u8 [N, K/32, 16]: a block's nibbles in Q4_0's order (the file's 64-weight runs of low
#         then high nibbles, reordered at load); sc, mn u8 [N, K/32, 1] (the 6-bit scales and mins
#         unpacked); d, dmin f16 [N, K/256, 1, 1]. w = (d * sc) * q - dmin * mn: 4.6 bits a weight.
#   q5_k  q4_k's parts, qs 20 bytes a block: q4_k's 16, then the fifth bits, weight j's at bit
#         j // 4 of byte 16 + j % 4 (a 4-byte word broadcast to 32 byte lanes, a mask per lane
#         picks them; the file's bits regrouped per block at load). 5.6 bits a weight.
#   q6_k  blocks of 16 (its scales'), 12 bytes each: qs u8 [N, K/16, 12], bytes 0..7 weight j's
#         low 4 bits | weight j + 8's << 4, bytes 8..11 the high 2 bits of weights j, j + 4,
#         j + 8, j + 12 at bits 0, 2, 4, 6 of byte 8 + j (q in 0..63, the weight q - 32: the file's
#         bits regrouped per block at load); sc i8 [N, K/16, 1]; d f16 [N, K/256, 1, 1].
#         w = (d * sc) * (q - 32): 6.6 bits a weight, as the file.
PARTS = {"q4_k": ("qs", "sc", "mn", "d", "dmin"), "q5_k": ("qs", "sc", "mn", "d", "dmin"),
         "q6_k": ("qs", "sc", "d")}
ROWS = {"q4_k": q4_k_rows, "q5_k": lambda w: q4_k_rows(w, top=31), "q6_k": q6_k_rows}


def q4_k_m(layer: str) -> str:
    """The format of a linear layer (its qualified name) in llama.cpp's Q4_K_M mix, simplified:
    Q6_K for the output and the down projections, Q4_K for the rest."""
    return "q6_k" if layer == "lm_head" or layer.endswith("down_proj") else "q4_k"


def q5_k_m(layer: str) -> str:
    """The same for llama.cpp's Q5_K_M mix: Q5_K where Q4_K_M has Q4_K."""
    return q4_k_m(layer).replace("q4_k", "q5_k")


def split_kquant(rows: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """The parts (PARTS) of GGUF block rows [N, K/256 * bytes] of a Q4_K, Q5_K or Q6_K tensor."""
    n = rows.shape[0]
    b = rows.view(torch.uint8).reshape(n, -1, BYTES[fmt.upper()])
    def f16(at):                                                  # fp16 bytes -> [N, S, 1, 1]
        return b[..., at:at + 2].contiguous().view(torch.float16)[..., None]
    if fmt in ("q4_k", "q5_k"):
        s = b[..., 4:16]
        sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
        mn = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
        q = b[..., -128:].reshape(n, -1, 4, 1, 32)
        q = torch.cat([q & 15, q >> 4], 3).reshape(n, -1, 2, 16)   # 32 weights: Q4_0's order
        qs = q[:, :, 0] | (q[:, :, 1] << 4)
        if fmt == "q5_k":                                           # block j's bit of byte l ->
            h = (b[..., 16:48, None] >> torch.arange(8, dtype=torch.uint8)) & 1   # bit l // 4 of
            h = h.transpose(-1, -2).reshape(n, -1, 8, 8, 4) << torch.arange(8, dtype=torch.uint8)[:, None]
            qs = torch.cat([qs, h.sum(-2, dtype=torch.uint8).reshape(n, -1, 4)], -1)  # its l % 4
        return dict(qs=qs.contiguous(),
                    sc=sc.reshape(n, -1, 1), mn=mn.reshape(n, -1, 1), d=f16(0), dmin=f16(2))
    ql = b[..., :128].reshape(n, -1, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8).view(2, 1)
    qh = b[..., 128:192].reshape(n, -1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)
    q = ((ql & 15).reshape(n, -1, 2, 4, 32) | ((qh & 3) << 4)).reshape(n, -1, 16)   # blocks of 16
    return dict(qs=q6_k_pack(q), sc=b[..., 192:208].contiguous().view(torch.int8).reshape(n, -1, 1),
                d=f16(208))


def q6_k_pack(q: torch.Tensor) -> torch.Tensor:
    """Blocks [..., 16] of 6-bit q as strata's 12 bytes each (PARTS' q6_k)."""
    h = q >> 4
    return torch.cat([(q[..., :8] & 15) | ((q[..., 8:] & 15) << 4),
                      h[..., 0:4] | (h[..., 4:8] << 2) | (h[..., 8:12] << 4) | (h[..., 12:] << 6)], -1)


def q6_k_unpack(qs: torch.Tensor) -> torch.Tensor:
    """strata's Q6_K blocks [..., 12] as the float weights q - 32 [..., 16] (torch ops that the
    product reading them fuses)."""
    h = qs[..., 8:]
    high = torch.cat([h & 3, (h >> 2) & 3, (h >> 4) & 3, h >> 6], -1)
    return (torch.cat([qs[..., :8] & 15, qs[..., :8] >> 4], -1) | (high << 4)).to(torch.float32) - 32


def q5_k_unpack(qs: torch.Tensor) -> torch.Tensor:
    """strata's Q5_K blocks [..., 20] as their q [..., 32] in 0..31 (torch ops that the product
    reading them fuses: a slice per fifth bit, so each lane's byte is an affine index)."""
    h = qs[..., 16:]
    return torch.cat([qs[..., :16] & 15, qs[..., :16] >> 4], -1) \
        | (torch.cat([(h >> b) & 1 for b in range(8)], -1) << 4)


def dequantize_kquant(parts: dict[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """The float32 weight [N, K] of a K-quant's parts, with the ops QuantLinear compiles."""
    n, s = parts["d"].shape[:2]
    d = parts["d"].to(torch.float32)
    if fmt in ("q4_k", "q5_k"):
        q = q5_k_unpack(parts["qs"]) if fmt == "q5_k" else torch.cat([parts["qs"] & 15, parts["qs"] >> 4], -1)
        q = q.to(torch.float32).view(n, s, 8, 32)
        w = (d * parts["sc"].view(n, s, 8, 1).to(torch.float32)) * q \
            - parts["dmin"].to(torch.float32) * parts["mn"].view(n, s, 8, 1).to(torch.float32)
        return w.reshape(n, -1)
    q = q6_k_unpack(parts["qs"]).view(n, s, 16, 16)
    return ((d * parts["sc"].view(n, s, 16, 1).to(torch.float32)) * q).reshape(n, -1)


def quantize_kquant(w: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """The parts of a 2-d weight [N, K] quantized round-to-nearest (K a multiple of 256)."""
    return split_kquant(ROWS[fmt](w.detach()), fmt)
