"""The LLM op suite: the ops a Llama-family decoder spends its time in, as small torch modules at
TinyLlama-1.1B and Qwen2.5-7B shapes, batch 1, for a number of tokens `seq`.

Written the way Hugging Face transformers writes them (rotate_half RoPE, repeat_kv for grouped-
query attention, SiLU-gated MLP), so what strata compiles is what users run. Attention is
self-attention over the `seq` tokens (prefill; seq 1 is a single token with no KV cache);
decode_sdpa is one new token's attention over a KV cache of `seq` positions, as decode runs it.
Weights are initialised on the meta device and filled in place (fast on any device, seed 0);
building on "meta" checks every shape without memory or compute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core import dtypes
from ..core.errors import StrataError


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float
    qkv_bias: bool


MODELS = {
    "tinyllama": ModelShape("tinyllama", 2048, 32, 4, 64, 5632, 1e-5, 10000.0, False),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 3584, 28, 4, 128, 18944, 1e-6, 1000000.0, True),
}
SEQS = (1, 128, 2048)
DTYPES = ("f32", "bf16")
DTYPE_ALIASES = {"fp32": "f32", "float32": "f32", "f32": "f32", "bf16": "bf16", "bfloat16": "bf16",
                 "fp16": "f16", "f16": "f16", "float16": "f16"}


# ---- the modules ----------------------------------------------------------------------------

def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x, n_rep: int):
    """(b, kv_heads, s, d) -> (b, kv_heads * n_rep, s, d), each kv head serving n_rep query heads."""
    b, kv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def rope_cos_sin(seq: int, head_dim: int, theta: float, dtype, device):
    """cos, sin of shape (1, 1, seq, head_dim), as a Llama rotary embedding computes them."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None, None].to(dtype), emb.sin()[None, None].to(dtype)


class Softmax(nn.Module):
    def forward(self, scores):
        return torch.softmax(scores, dim=-1)


class RoPE(nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rope(q, k, cos, sin)


class SiluMul(nn.Module):
    def forward(self, gate, up):
        return F.silu(gate) * up


class Gelu(nn.Module):
    def forward(self, x):
        return F.gelu(x, approximate="tanh")


class AddRMSNorm(nn.Module):
    """Residual add then RMSNorm; returns (normed, new residual) as a fused decoder does."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)

    def forward(self, x, residual):
        h = x + residual
        return self.norm(h), h


class CausalSDPA(nn.Module):
    def __init__(self, n_rep: int, causal: bool = True):
        super().__init__()
        self.n_rep, self.causal = n_rep, causal

    def forward(self, q, k, v):
        k, v = repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)   # one query: none


class QKVProjection(nn.Module):
    def __init__(self, m: ModelShape):
        super().__init__()
        self.q_proj = nn.Linear(m.hidden, m.heads * m.head_dim, bias=m.qkv_bias)
        self.k_proj = nn.Linear(m.hidden, m.kv_heads * m.head_dim, bias=m.qkv_bias)
        self.v_proj = nn.Linear(m.hidden, m.kv_heads * m.head_dim, bias=m.qkv_bias)

    def forward(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)


class MLP(nn.Module):
    def __init__(self, m: ModelShape):
        super().__init__()
        self.gate_proj = nn.Linear(m.hidden, m.intermediate, bias=False)
        self.up_proj = nn.Linear(m.hidden, m.intermediate, bias=False)
        self.down_proj = nn.Linear(m.intermediate, m.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    def __init__(self, m: ModelShape):
        super().__init__()
        self.m = m
        self.qkv = QKVProjection(m)
        self.o_proj = nn.Linear(m.heads * m.head_dim, m.hidden, bias=False)

    def forward(self, x, cos, sin):
        m, (b, s, _) = self.m, x.shape
        q, k, v = self.qkv(x)
        q = q.view(b, s, m.heads, m.head_dim).transpose(1, 2)
        k = k.view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
        v = v.view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        n_rep = m.heads // m.kv_heads
        o = F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, m.heads * m.head_dim))


class DecoderBlock(nn.Module):
    """One Llama decoder layer: pre-norm attention and SiLU MLP, each with its residual."""

    def __init__(self, m: ModelShape):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(m.hidden, eps=m.eps)
        self.self_attn = Attention(m)
        self.post_attention_layernorm = nn.RMSNorm(m.hidden, eps=m.eps)
        self.mlp = MLP(m)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


# ---- the ops of the suite: module, inputs and ideal FLOPs -----------------------------------

def _qkv_flops(m, s):
    return 2 * s * m.hidden * (m.heads + 2 * m.kv_heads) * m.head_dim


def _mlp_flops(m, s):
    return 2 * s * m.hidden * m.intermediate * 3


def _attn_flops(m, s):
    """QK^T and PV over the unmasked (causal) pairs: s(s+1)/2 per head, 2 * 2 * head_dim each."""
    return 4 * m.heads * m.head_dim * (s * (s + 1) // 2)


def _decoder_flops(m, s):
    return _qkv_flops(m, s) + 2 * s * m.heads * m.head_dim * m.hidden + _attn_flops(m, s) + _mlp_flops(m, s)


def _module(op: str, m: ModelShape) -> nn.Module:
    return {
        "rmsnorm": lambda: nn.RMSNorm(m.hidden, eps=m.eps),
        "layernorm": lambda: nn.LayerNorm(m.hidden, eps=1e-5),
        "softmax": Softmax, "rope": RoPE, "silu_mul": SiluMul, "gelu": Gelu,
        "add_rmsnorm": lambda: AddRMSNorm(m.hidden, m.eps),
        "sdpa": lambda: CausalSDPA(m.heads // m.kv_heads),
        "decode_sdpa": lambda: CausalSDPA(m.heads // m.kv_heads, causal=False),
        "qkv_proj": lambda: QKVProjection(m),
        "mlp": lambda: MLP(m),
        "decoder_block": lambda: DecoderBlock(m),
    }[op]()


def _inputs(op: str, m: ModelShape, s: int, dt, dev) -> tuple:
    H, KV, D, N, I = m.heads, m.kv_heads, m.head_dim, m.hidden, m.intermediate
    shapes = {
        "rmsnorm": [(1, s, N)], "layernorm": [(1, s, N)], "softmax": [(1, H, s, s)],
        "rope": [(1, H, s, D), (1, KV, s, D)], "silu_mul": [(1, s, I), (1, s, I)],
        "gelu": [(1, s, I)], "add_rmsnorm": [(1, s, N), (1, s, N)],
        "sdpa": [(1, H, s, D), (1, KV, s, D), (1, KV, s, D)],
        "decode_sdpa": [(1, H, 1, D), (1, KV, s, D), (1, KV, s, D)],
        "qkv_proj": [(1, s, N)], "mlp": [(1, s, N)], "decoder_block": [(1, s, N)],
    }[op]
    inputs = tuple(torch.randn(shape, dtype=dt, device=dev) for shape in shapes)
    if op in ("rope", "decoder_block"):
        inputs += rope_cos_sin(s, D, m.rope_theta, dt, dev)
    return inputs


OPS = {   # name: (what it is, ideal FLOPs(model, seq))
    "rmsnorm": ("RMSNorm over hidden", None),
    "layernorm": ("LayerNorm over hidden", None),
    "softmax": ("softmax over attention scores (1, heads, seq, seq)", None),
    "rope": ("rotary embedding, rotate_half form, on q and k", None),
    "silu_mul": ("SiLU(gate) * up at the MLP width", None),
    "gelu": ("GELU (tanh) at the MLP width", None),
    "add_rmsnorm": ("residual add + RMSNorm, returning both", None),
    "sdpa": ("causal scaled dot-product attention with GQA (repeat_kv)", _attn_flops),
    "decode_sdpa": ("one token's attention over a KV cache of seq positions, GQA",
                    lambda m, s: 4 * m.heads * m.head_dim * s),
    "qkv_proj": ("q, k, v projections", _qkv_flops),
    "mlp": ("MLP projections: down(silu(gate(x)) * up(x))", _mlp_flops),
    "decoder_block": ("a full Llama decoder block", _decoder_flops),
}


@dataclass(frozen=True)
class Case:
    op: str
    model: ModelShape
    seq: int
    dtype: str          # strata dtype name: "f32", "bf16"

    @property
    def name(self) -> str:
        return f"{self.op} {self.model.name} seq={self.seq} {self.dtype}"

    @property
    def description(self) -> str:
        return OPS[self.op][0]

    def flops(self) -> int:
        fn = OPS[self.op][1]
        return fn(self.model, self.seq) if fn else 0

    def build(self, device="cpu", seed: int = 0):
        """(module, inputs) on `device`: parameters filled from `seed`, no autograd."""
        torch.manual_seed(seed)
        dt = dtypes.to_torch(self.dtype)
        with torch.device("meta"):
            module = _module(self.op, self.model)
        module = module.to(dt).to_empty(device=device).eval().requires_grad_(False)
        init_parameters(module)
        return module, _inputs(self.op, self.model, self.seq, dt, device)


def init_parameters(module: nn.Module) -> None:
    """Linear weights N(0, 1/in_features); norm weights 1 + N(0, 0.1); biases N(0, 0.1)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
            elif name.endswith("weight"):
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.1)


def parse_list(text: str | None, allowed, what: str, aliases=None) -> list:
    """"a,b" -> ["a", "b"], each checked against `allowed` (after `aliases`)."""
    if not text:
        return list(allowed)
    out = []
    for item in (t.strip().lower() for t in text.split(",") if t.strip()):
        item = (aliases or {}).get(item, item)
        if item not in allowed:
            raise StrataError(f"unknown {what} {item!r}; choose from {', '.join(map(str, allowed))}")
        out.append(item)
    return out


def cases(models=tuple(MODELS), seqs=SEQS, dtypes=DTYPES, ops=tuple(OPS)) -> list[Case]:
    """Every combination, grouped by model, then dtype, then op, then seq."""
    return [Case(op, MODELS[m], s, dt) for m in models for dt in dtypes for op in ops for s in seqs]
