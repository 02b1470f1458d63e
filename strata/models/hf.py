"""The one place strata imports transformers: lazily, offline, and with the few calls whose
spelling differs between transformers 4.x and 5.x (the dtype argument, a decoder layer's return).

Offline: HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE are set before the import, so nothing strata
does can reach the Hugging Face hub.
"""
from __future__ import annotations

import inspect
import os
import sys

import torch
from torch import nn

from ..core.errors import ModelError


def transformers():
    """The transformers module, imported offline on first use."""
    mod = sys.modules.get("transformers")
    if mod is not None:
        return mod
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers as mod
    except ImportError:
        raise ModelError("compiling a Hugging Face model needs the transformers package; "
                         "pip install transformers safetensors") from None
    mod.logging.set_verbosity_error()
    return mod


def major_version() -> int:
    return int(transformers().__version__.split(".")[0])


def from_config(config, dtype: torch.dtype, device: str = "meta") -> nn.Module:
    """An eager-attention causal LM for `config` with parameters of `dtype` on `device`.

    Eager attention is matmul + softmax, which strata lowers; the rotary buffers keep float32,
    as transformers makes them."""
    tf = transformers()
    kw = {"dtype": dtype} if major_version() >= 5 else {"torch_dtype": dtype}
    try:
        with torch.device(device):
            model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager", **kw)
    except ValueError as e:      # a model_type without a causal-LM class
        raise ModelError(f"transformers cannot build a causal LM from this config: "
                         f"{str(e).splitlines()[0]}") from None
    return model.eval()


def is_causal_lm(module) -> bool:
    """A transformers model with a language-model head (what strata.compile returns logits for)."""
    tf = sys.modules.get("transformers")
    if tf is None or not isinstance(module, tf.PreTrainedModel):
        return False
    try:
        return module.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return False


def decoder(model: nn.Module, use: str = "--layer") -> nn.Module:
    """The decoder stack (`model.model` for Llama/Qwen2: embed_tokens, layers, norm, rotary_emb);
    `use` names what needs it, for the error."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ModelError(f"{type(model).__name__} has no model.layers: {use} supports "
                         f"Llama-style decoders (Llama, Qwen2, Mistral ...)")
    return inner


def layer_output(out):
    """A decoder layer's hidden states: transformers 5 returns the tensor, 4.x a tuple."""
    return out[0] if isinstance(out, (tuple, list)) else out


def cache_argument(layer: nn.Module, cache) -> dict:
    """The keyword a decoder layer takes its KV cache by: past_key_values (transformers >= 4.56),
    past_key_value before."""
    params = inspect.signature(layer.forward).parameters
    return {"past_key_values" if "past_key_values" in params else "past_key_value": cache}
