"""Tiny random models of each supported family, written to disk as Hugging Face checkpoints by
the tests themselves (nothing is downloaded): 2 layers, hidden 64-128, grouped-query attention,
and each family's quirks (Qwen2's qkv bias, tied embeddings, Llama-3 rope scaling)."""
import json

import torch

FAMILIES = {
    # TinyLlama-style: untied embeddings, 4 query heads sharing 2 kv heads
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=96, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False),
    # Qwen2.5-style: qkv bias (implied by model_type qwen2), tied embeddings, rope theta 1e6
    "qwen2": dict(model_type="qwen2", hidden_size=96, intermediate_size=160, num_attention_heads=6,
                  num_key_value_heads=2, vocab_size=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True, use_sliding_window=False),
    # SmolLM2-style: Llama with tied embeddings, 3 heads sharing one kv head
    "smollm2": dict(model_type="llama", hidden_size=96, intermediate_size=192, num_attention_heads=3,
                    num_key_value_heads=1, vocab_size=80, rms_norm_eps=1e-5, rope_theta=100000.0,
                    tie_word_embeddings=True),
    # Llama-3.2-style: explicit head_dim, tied embeddings, llama3 rope scaling
    "llama3": dict(model_type="llama", hidden_size=128, intermediate_size=256, num_attention_heads=8,
                   num_key_value_heads=2, head_dim=16, vocab_size=112, rms_norm_eps=1e-5,
                   rope_theta=500000.0, tie_word_embeddings=True,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                     high_freq_factor=4.0, original_max_position_embeddings=16)),
}
COMMON = dict(num_hidden_layers=2, max_position_embeddings=64, hidden_act="silu",
              torch_dtype="float32")


def config_dict(family: str) -> dict:
    return {**COMMON, **FAMILIES[family]}


def hf_model(family: str, seed: int = 0, **changes):
    """An fp32 eager model whose every parameter (norm weights and biases included) is random,
    so that no term of the forward pass can hide behind a zero or a one. `changes`: config
    fields to override (num_hidden_layers=4)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    raw = {**config_dict(family), **changes}
    cfg = AutoConfig.for_model(**raw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape))
            else:
                p.copy_(0.08 * torch.randn(p.shape))
    return model


def write_checkpoint(model, directory, shard_size=None):
    """model.save_pretrained as safetensors (config.json included); shard_size shards it."""
    from transformers.utils import logging
    logging.disable_progress_bar()
    kw = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(directory, safe_serialization=True, **kw)
    return directory


def patch_config(directory, **changes):
    path = directory / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))
