"""FP8 linears (`strata.quantize(model, "fp8")`, `--quant fp8`): Hopper's e4m3 product, in eager.

The weight is stored once, at load, as float8_e4m3fn with one float32 scale per output row
(max |w| / 448); each call rounds its activations to e4m3 per row the same way, and the product
is torch._scaled_mm with both row scales. So eager and strata run the same arithmetic (a product
of e4m3 values, summed in f32, scaled, rounded to the activations' dtype): strata captures the
ops, and on sm_90a the contraction runs on wgmma's e4m3 form; on a CPU it reads one byte a weight.
"""
from __future__ import annotations

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def to_e4m3_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with q = x / scale in e4m3 and scale = max |row| / 448 (float32, [rows, 1]);
    a row of zeros gets a tiny scale, so q is 0 and never NaN."""
    x = x.float()
    scale = (x.abs().amax(-1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    return (x / scale).to(E4M3), scale


class FP8Linear(nn.Module):
    """nn.Linear with an e4m3 weight (`qw` [N, K]) and row scales (`scale` [N, 1] float32)."""

    def __init__(self, qw: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = qw.shape
        self.register_buffer("qw", qw)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "FP8Linear":
        qw, scale = to_e4m3_rows(linear.weight.detach())
        return cls(qw, scale, None if linear.bias is None else linear.bias.detach())

    def _apply(self, fn, recurse=True):
        """Moves follow `fn`; the dtypes stay: `model.to(torch.bfloat16)` would cast every float
        buffer, the e4m3 weight and its float32 scales included."""
        qw, scale = self.qw, self.scale
        super()._apply(fn, recurse)
        self.qw, self.scale = qw.to(self.qw.device), scale.to(self.qw.device)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, sx = to_e4m3_rows(x.reshape(-1, self.in_features))
        y = torch._scaled_mm(q, self.qw.t(), scale_a=sx, scale_b=self.scale.t(), out_dtype=x.dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"fp8 e4m3, in_features={self.in_features}, out_features={self.out_features}"
