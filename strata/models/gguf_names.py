"""llama.cpp's names and row order for a Llama model's tensors, against transformers'.

Why a file of its own: the reader (gguf_file.py) and the writer (gguf_write.py) must agree on
them exactly. llama.cpp's converter (convert_hf_to_gguf.py) renames every tensor and permutes the
rows of attn_q and attn_k (weights and biases) from Hugging Face's rotate-half rope layout to its
interleaved one; rope_rows does that or undoes it on the first dimension only, so a quantized
tensor's rows of blocks move as they are.
"""
from __future__ import annotations

import re

import torch

# llama.cpp's tensor names (before .weight/.bias) -> transformers' Llama module names
GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}


def hf_name(name: str) -> str | None:
    """The transformers name of a GGUF tensor name, or None when it is not a Llama tensor."""
    base, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    if base in GLOBAL:
        return f"{GLOBAL[base]}.{kind}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in LAYER:
        return f"model.layers.{m.group(1)}.{LAYER[m.group(2)]}.{kind}"
    return None


def gguf_name(name: str) -> str:
    """The GGUF name of a transformers Llama tensor name (the inverse of hf_name)."""
    base, _, kind = name.rpartition(".")
    for g, h in GLOBAL.items():
        if base == h:
            return f"{g}.{kind}"
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", base)
    g = next(k for k, v in LAYER.items() if m and v == m.group(2))
    return f"blk.{m.group(1)}.{g}.{kind}"


def rope_rows(rows: torch.Tensor, n_head: int, to_gguf: bool) -> torch.Tensor:
    """llama.cpp's q/k row permutation (convert_hf_to_gguf.py `permute`) or its inverse, on the
    first dimension only: head h's rows (pairs, half) <-> (half, pairs)."""
    n = rows.shape[0]
    split = (n_head, 2, n // n_head // 2) if to_gguf else (n_head, n // n_head // 2, 2)
    return rows.reshape(*split, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)
