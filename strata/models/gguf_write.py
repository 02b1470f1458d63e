"""Write a transformers Llama model as a llama.cpp GGUF file (F32, F16, BF16, Q8_0, Q4_0, or
the mix a Q4_K_M or Q5_K_M file holds).

Why: nothing is downloaded here, so the tests (and a benchmark) make their GGUF files from a
Hugging Face model: llama.cpp's tensor names and `llama.*` metadata, attn_q/attn_k rows permuted
for its rope layout, norms and other 1-d tensors in F32 and the 2-d ones in the chosen type, as
llama.cpp's convert_hf_to_gguf.py and llama-quantize do. Quantized blocks are strata's
quantize_weight (the same bytes as gguf.quants.quantize) packed as GGUF stores them: d, then qs.
q4_k_m is llama.cpp's mix: Q6_K for output.weight and the down projections, Q4_K for the other
2-d weights, Q8_0 where a row is not whole 256-weight super-blocks (quant/kquants.py's
round-to-nearest K-quants: the same layout as llama-quantize's, other rounding); q5_k_m the
same with Q5_K for Q4_K.
Without a tokenizer a placeholder sentencepiece vocabulary is written (special tokens, "▁", single
letters and "▁"-prefixed letters, then unused fillers), enough for transformers to build one.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..core.errors import ModelError
from ..quant.formats import BLOCK, quantize_weight
from ..quant.kquants import QK_K, ROWS, q4_k_m, q5_k_m
from .gguf_names import gguf_name, rope_rows

FORMATS = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m")


def _rope(config) -> tuple[float, dict]:
    """(rope theta, the rope scaling dict or {}) under transformers 4's and 5's spellings."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = dict(getattr(config, "rope_scaling", None) or params)
    theta = getattr(config, "rope_theta", None) or params.get("rope_theta", 10000.0)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return float(theta), ({} if kind == "default" else scaling)


def placeholder_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a toy sentencepiece vocabulary of n tokens."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["<unk>", "<s>", "</s>", "\u2581"] + letters + ["\u2581" + c for c in letters]
    tokens = (pieces + [f"<unused{i}>" for i in range(n)])[:n]
    types = [2, 3, 3] + [1] * (len(pieces) - 3) + [5] * n          # unknown, control, normal, unused
    scores = [0.0, 0.0, 0.0] + [-float(i) for i in range(n)]
    return tokens, scores[:n], types[:n]


def write_gguf(model: nn.Module, path, fmt: str = "q8_0", tokens: list[str] | None = None) -> Path:
    """Write `model` (a LlamaForCausalLM with float weights) to `path` with its 2-d weights in
    `fmt` (f32, f16, bf16, q8_0, q4_0, q4_k_m or q5_k_m); `tokens`: the vocabulary to store (default: a
    placeholder)."""
    import gguf                      # the gguf package: imported only to write GGUF files
    if fmt not in FORMATS:
        raise ModelError(f"unknown GGUF type {fmt!r}: write_gguf writes {', '.join(FORMATS)}")
    cfg = model.config
    if getattr(cfg, "model_type", None) != "llama":
        raise ModelError(f"write_gguf writes llama models, not {cfg.model_type!r}")
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    theta, scaling = _rope(cfg)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    w.add_file_type({"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "bf16": 32}[fmt])
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(hidden)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    if head_dim != hidden // heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    toks, scores, types = placeholder_vocab(cfg.vocab_size)
    if tokens is not None:
        toks, scores, types = list(tokens), [0.0] * len(tokens), [1] * len(tokens)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    for key in ("bos", "eos"):
        tid = getattr(cfg, f"{key}_token_id", None)
        if isinstance(tid, int):
            getattr(w, f"add_{key}_token_id")(tid)
    if scaling:
        w.add_tensor("rope_freqs.weight", _rope_divisors(model, theta, head_dim, scaling))
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    for name, t in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        t = t.detach().float()
        if name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
            t = rope_rows(t, heads if ".q_proj" in name else kv_heads, to_gguf=True)
        data, raw = _encode(t, _k_mix(name, t, fmt) if fmt.endswith("_k_m") else fmt, gguf)
        w.add_tensor(gguf_name(name), data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _k_mix(name: str, t: torch.Tensor, mix: str) -> str:
    """The type of one tensor in a q4_k_m or q5_k_m file (the module docstring)."""
    if t.dim() != 2 or t.shape[1] % QK_K:
        return "q8_0"
    return (q4_k_m if mix == "q4_k_m" else q5_k_m)(name.removesuffix(".weight"))


def _encode(t: torch.Tensor, fmt: str, gguf):
    """(numpy data, GGML type or None) of one tensor: 1-d, f32, or K not whole blocks -> F32."""
    if fmt in ROWS and t.dim() == 2:
        return ROWS[fmt](t).numpy(), gguf.GGMLQuantizationType[fmt.upper()]
    if t.dim() == 1 or fmt == "f32" or (fmt.startswith("q") and t.shape[1] % BLOCK):
        return t.numpy(), None
    if fmt == "f16":
        return t.half().numpy(), None
    if fmt == "bf16":                # numpy has no bfloat16: its bytes, typed by raw_dtype
        return t.bfloat16().view(torch.uint8).numpy(), gguf.GGMLQuantizationType.BF16
    qs, d = quantize_weight(t, fmt)
    blocks = torch.cat([d.view(torch.uint8), qs.view(torch.uint8)], -1)
    raw = gguf.GGMLQuantizationType.Q8_0 if fmt == "q8_0" else gguf.GGMLQuantizationType.Q4_0
    return blocks.reshape(t.shape[0], -1).numpy(), raw


def _rope_divisors(model, theta: float, head_dim: int, scaling: dict):
    """llama.cpp's rope_freqs for a scaled rope: the default inverse frequencies divided by the
    model's own (Llama-3 scaling: 1 for high frequencies, the factor for low ones)."""
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise ModelError(f"write_gguf writes default and llama3 rope, not {scaling!r}")
    inv = model.model.rotary_emb.inv_freq.float()
    base = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return (base / inv).numpy()
