"""Block-quantized weights, stored as GGUF stores them, dequantized by torch ops strata fuses.

Why torch ops and not a kernel: a QuantLinear's forward dequantizes its weight with integer and
float tensor ops (a nibble mask and shift, a cast, a multiply by the block's scale) and hands it
to F.linear. torch.export captures those ops, every strata stage prints them, the NumPy evaluators
and the simulator compute them, and fusion keeps them inside the matrix product that reads them:
the program reads the quantized bytes, never a dequantized copy.

Formats (blocks of BLOCK = 32 weights along the input dimension K, one fp16 scale `d` each):
  q8_0  qs int8 [N, K/32, 32]: w = d * qs
  q4_0  qs uint8 [N, K/32, 16]: w[j] = d * ((qs[j] & 15) - 8) and w[j + 16] = d * ((qs[j] >> 4) - 8)
        for j < 16 (GGUF's nibble order)
and, for a Hugging Face checkpoint quantized at load, the same layouts with bf16 scales:
  int8  per output channel: one scale a row, d [N, 1, 1] = max |w| / 127
  int4  per group of 32: q4_0's nibbles, d = max |w| / 7 (symmetric: q in -7..7, stored + 8)
and llama.cpp's K-quants q4_k, q5_k and q6_k (super-blocks of 256; their layout: quant/kquants.py).
`fp8` is not a block format: the layer becomes an FP8Linear (quant/fp8.py, torch._scaled_mm).
K is padded with zeros to a multiple of 32 (256 for a K-quant) where it is not one (a Hugging Face
weight; GGUF's are). quantize_weight rounds as llama.cpp does, so a weight quantized here and by the `gguf`
package gives the same bytes (tests/quant check it).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import StrataError
from .fp8 import FP8Linear
from .kquants import PARTS, QK_K, dequantize_kquant, q4_k_m, q5_k_m, quantize_kquant

BLOCK = 32
FORMATS = ("q8_0", "q4_0", "int8", "int4", "q4_k", "q5_k", "q6_k")
MIXES = {"q4_k_m": q4_k_m, "q5_k_m": q5_k_m}         # a format per layer, by its name
LAYERS = ("fp8",)                                       # a module of its own (quant/fp8.py)
BYTES_PER_BLOCK = {"q8_0": 2 + 32, "q4_0": 2 + 16}      # the scale and the packed weights (GGUF's)
INT8 = ("q8_0", "int8")                                  # bytes that are the weights' integers


def check_format(fmt: str, mixes: bool = True) -> str:
    """fmt, if strata quantizes to it (a mix such as q4_k_m, or fp8, where `mixes`), else one
    sentence."""
    if fmt not in FORMATS and not (mixes and fmt in (*MIXES, *LAYERS)):
        raise StrataError(f"unknown quantization {fmt!r}: strata quantizes to "
                          f"{', '.join(FORMATS + ((*MIXES, *LAYERS) if mixes else ()))}")
    return fmt


def quantize_weight(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(qs, d) of a 2-d weight [N, K], K padded to a multiple of 32 (see the module docstring)."""
    if check_format(fmt) in PARTS or fmt in MIXES or fmt in LAYERS:
        raise StrataError(f"{fmt} is not one (qs, d) pair: QuantLinear.from_linear makes it")
    n, k = w.shape
    w = F.pad(w.detach().float(), (0, -k % BLOCK)).view(n, -1, BLOCK)
    if fmt in INT8:
        amax = w.abs().amax(-1, keepdim=True) if fmt == "q8_0" else w.abs().amax((1, 2), keepdim=True)
        d = amax / 127          # q8_0 divides by the fp32 scale and stores it rounded (llama.cpp)
        d = d if fmt == "q8_0" else d.to(torch.bfloat16).float()     # int8: by the one it stores
        v = w * torch.where(d == 0, 0, 1 / d)
        qs = (torch.sign(v) * torch.floor(v.abs() + 0.5)).clamp(-127, 127).to(torch.int8)  # roundf
        return qs, d.to(torch.float16 if fmt == "q8_0" else torch.bfloat16)
    if fmt == "int4":
        d = (w.abs().amax(-1, keepdim=True) / 7).to(torch.bfloat16).float()  # the scale it stores
        q = (torch.round(w * torch.where(d == 0, 0, 1 / d)).clamp(-7, 7) + 8).to(torch.uint8)
        return (q[..., :16] | (q[..., 16:] << 4)), d.to(torch.bfloat16)
    # q4_0: the signed value of largest magnitude maps to -8 (llama.cpp's quantize_row_q4_0)
    big = w.gather(-1, w.abs().argmax(-1, keepdim=True))
    d = big / -8
    inv = torch.where(d == 0, 0, 1 / d)
    q = torch.clamp(torch.trunc(w * inv + 8.5), max=15).to(torch.uint8)
    return (q[..., :16] | (q[..., 16:] << 4)), d.to(torch.float16)


def dequantize(qs: torch.Tensor, d: torch.Tensor, fmt: str) -> torch.Tensor:
    """The float32 weight [N, K/32 * 32] of (qs, d), with the ops QuantLinear compiles."""
    if fmt in INT8:
        q = qs.to(torch.float32)
    elif fmt in ("q4_0", "int4"):
        q = torch.cat([qs & 15, qs >> 4], -1).to(torch.float32) - 8
    else:
        check_format(fmt)
        raise StrataError(f"{fmt} is not one (qs, d) pair: QuantLinear.weight dequantizes it")
    return (q * d.to(torch.float32)).flatten(-2)


def int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """x (last dimension a multiple of 32) rounded as llama.cpp and QDOT=vnni's kernels quantize
    activations: per block of 32, d = max |x| / 127 and q = round(x / d), returned as q * d."""
    b = x.unflatten(-1, (-1, BLOCK))
    d = b.abs().amax(-1, keepdim=True) / 127
    return (torch.round(b * torch.where(d > 0, 1 / d, 0)) * d).flatten(-2)


class QuantLinear(nn.Module):
    """nn.Linear with a block-quantized weight (buffers `qs` and `d`) and an optional bias."""

    def __init__(self, fmt: str, in_features: int, qs: torch.Tensor, d: torch.Tensor,
                 bias: torch.Tensor | None = None, **parts: torch.Tensor):
        super().__init__()
        self.fmt, self.in_features = check_format(fmt, mixes=False), in_features
        self.out_features = qs.shape[0]
        self.register_buffer("qs", qs)
        self.register_buffer("d", d)
        for name, t in parts.items():           # a K-quant's other parts (quant/kquants.py)
            self.register_buffer(name, t)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str) -> "QuantLinear":
        bias = None if linear.bias is None else linear.bias.detach()
        if fmt in PARTS:
            w = linear.weight.detach()
            parts = quantize_kquant(F.pad(w, (0, -w.shape[1] % QK_K)), fmt)
            return cls(fmt, linear.in_features, bias=bias, **parts)
        qs, d = quantize_weight(linear.weight, fmt)
        return cls(fmt, linear.in_features, qs, d, bias)

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        w = dequantize_kquant({n: getattr(self, n) for n in PARTS[self.fmt]}, self.fmt) \
            if self.fmt in PARTS else dequantize(self.qs, self.d, self.fmt)
        return (w if w.shape[1] == self.in_features else w[:, :self.in_features]).to(dtype)

    int8_activations = False      # eager only: round x as QDOT=vnni's kernels do (a reference;
                                  # a row of partial blocks keeps the float lanes there, so here)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.int8_activations and x.shape[-1] % BLOCK == 0:
            return F.linear(int8_blocks(x.float()), self.weight(torch.float32), bias).to(x.dtype)
        return F.linear(x, self.weight(x.dtype), bias)

    def extra_repr(self) -> str:
        return f"{self.fmt}, in_features={self.in_features}, out_features={self.out_features}"


def quantize(model: nn.Module, fmt: str, skip: tuple[str, ...] = ()) -> nn.Module:
    """`model` with every nn.Linear (but those whose qualified name ends with one in `skip`)
    replaced in place by a QuantLinear of format `fmt` (a mix: the format its name gets; fp8: an
    FP8Linear); the full-precision weights are dropped."""
    pick = MIXES.get(check_format(fmt), lambda layer: fmt)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not full.endswith(skip):
                setattr(module, child_name, FP8Linear.from_linear(child) if fmt == "fp8"
                        else QuantLinear.from_linear(child, pick(full)))
    return model
