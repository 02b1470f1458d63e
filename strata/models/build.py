"""Build what `strata compile MODEL` captures: a transformers causal LM (or one decoder layer of
it) with its example inputs.

Compiling needs shapes only (Torch IR to CUDA never reads a weight value), so by default the
model is built with fake tensors (torch's FakeTensorMode: shapes and dtypes, no storage) and
captured as such: a 7B model compiles in a few hundred MB. (Fake rather than meta tensors:
transformers 4.x opens a `torch.autocast` on the input's device inside the rotary embedding,
which the meta device does not support.) A checkpoint, when the directory has one, is still
checked against the config from its file headers.

`materialise=True` (to run the program) builds on the meta device, allocates only what is
captured (one layer with `layer=N`) on the CPU, then loads the checkpoint, or without one draws
random weights from a fixed seed (per tensor, so layer N is the same whether built alone or in
the whole model). Buffers transformers computes at construction (the rotary inverse
frequencies) are recomputed, and tied embeddings tied again.

A GGUF file's quantized linear weights become QuantLinear modules before anything is allocated
(gguf_file.py), so they are only ever held as the file's blocks; `quant` (q8_0, q4_0) quantizes
a float model's linear layers once loaded (strata.quant.formats.quantize), lm_head too unless it
is tied to the embeddings.
"""
from __future__ import annotations

import zlib
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..core.errors import ModelError
from ..quant.formats import check_format, quantize
from . import checkpoint as ckpt_mod
from . import hf
from .source import ModelSource, hf_config, resolve
from .wrappers import CausalLMLogits, DecoderLayer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SEED = 0


@dataclass
class BuiltModel:
    source: ModelSource
    config: object                   # the transformers config
    model: nn.Module                 # the transformers model (fake or meta where not materialised)
    module: nn.Module                # what is captured: CausalLMLogits or DecoderLayer
    example_inputs: tuple
    input_names: list[str]
    dtype: str                       # bf16 | fp16 | fp32
    layer: int | None
    weights: str                     # where the weights come from, one phrase for the user
    materialised: bool

    @property
    def what(self) -> str:
        n = self.config.num_hidden_layers
        part = f"decoder layer {self.layer} of {n}" if self.layer is not None else f"{n} layers"
        return f"{self.source.name} ({self.source.description}; {part}, {self.dtype})"


def default_dtype(config) -> str:
    """The config's torch_dtype as a --dtype name (bf16 when it names none strata runs)."""
    raw = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None)
    name = str(raw).replace("torch.", "")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(name, "bf16")


def build(model: str, layer: int | None = None, seq_len: int = 128, dtype: str | None = None,
          materialise: bool = False, quant: str | None = None) -> BuiltModel:
    """The capture-ready module for MODEL (a bundled name, a directory or a GGUF file); `quant`
    quantizes its float linear weights (q8_0 or q4_0)."""
    if quant is not None:
        check_format(quant)
    source = resolve(model)
    config = hf_config(source)
    dtype = dtype or default_dtype(config)
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; choose bf16, fp16 or fp32")
    n_layers = config.num_hidden_layers
    if layer is not None and not 0 <= layer < n_layers:
        raise ModelError(f"--layer {layer} is out of range: {source.name} has layers 0..{n_layers - 1}")
    if seq_len < 1:
        raise ModelError(f"--seq-len must be at least 1, not {seq_len}")
    fake = None if materialise else FakeTensorMode()
    with fake or nullcontext():
        lm = hf.from_config(config, DTYPES[dtype], device="meta" if materialise else "cpu")
    tied = bool(getattr(config, "tie_word_embeddings", False))
    gguf = source.gguf
    ckpt = ckpt_mod.find(source.directory)
    prefix = f"model.layers.{layer}." if layer is not None else None
    names = ckpt_mod.check(ckpt, lm, tied, only=prefix) if ckpt else []
    if gguf is not None:
        names = gguf.check(lm, tied, only=prefix)
        with fake or nullcontext():
            gguf.quantized_layout(lm)
    if materialise:
        part = hf.decoder(lm).layers[layer] if layer is not None else lm
        _materialise(lm, part)
        if gguf is not None:
            notes = gguf.load(_state(lm), names, config)
            weights = "; ".join([f"loaded from {gguf.description}", *notes])
            _rope_divisors(lm, gguf)
            gguf.release()
        elif ckpt:
            ckpt_mod.load(ckpt, _state(lm), names)
            weights = f"loaded from {ckpt.description}"
        else:
            _random_weights(lm, part, prefix or "", config)
            weights = f"random (seed {SEED}): {source.name} has no checkpoint"
        if tied:
            lm.get_output_embeddings().weight = lm.get_input_embeddings().weight
    elif gguf is not None or ckpt:
        weights = (f"not loaded, compiling needs shapes only "
                   f"({(gguf or ckpt).description}, checked against the config)")
    else:
        weights = (f"none: no checkpoint, so a run would use random weights (seed {SEED}); "
                   f"compiled from shapes only")
    if quant is not None:
        with fake or nullcontext():
            weights += _quantize(lm, quant, tied)
    if layer is None:
        module, names_in = CausalLMLogits(lm), ["input_ids"]
    else:
        module, names_in = DecoderLayer(lm, layer), ["hidden_states"]
    with fake or nullcontext():
        inputs = _example_inputs(config, layer, seq_len, DTYPES[dtype])
    return BuiltModel(source, config, lm, module.eval(), inputs, names_in, dtype, layer, weights,
                      materialise)


def _state(lm: nn.Module) -> dict:
    """Every parameter and buffer of `lm` by qualified name (tied ones under each name)."""
    return dict(lm.named_parameters(remove_duplicate=False)) | dict(lm.named_buffers())


def _quantize(lm: nn.Module, fmt: str, tied: bool) -> str:
    """Quantize lm's float linear layers to `fmt`; the phrase saying so (and about lm_head)."""
    if not any(isinstance(m, nn.Linear) for m in lm.modules()):
        raise ModelError(f"--quant {fmt}: the linear weights are quantized already (a GGUF "
                         f"file's Q8_0/Q4_0/Q4_K/Q6_K); --quant quantizes float weights")
    quantize(lm, fmt, skip=("lm_head",) if tied else ())
    head = ("lm_head kept as it is: tied to the embeddings" if tied else "lm_head too")
    return f"; linear weights quantized to {fmt} at load ({head})"


def _rope_divisors(lm: nn.Module, gguf) -> None:
    """Llama-3 rope scaling from a GGUF file: the rotary inverse frequencies divided by the
    file's rope_freqs (transformers recomputed them from the config's plain rope)."""
    div = gguf.rope_divisors()
    rotary = getattr(getattr(lm, "model", None), "rotary_emb", None)
    if div is None or rotary is None:
        return
    for b in ("inv_freq", "original_inv_freq"):
        freq = getattr(rotary, b, None)
        if isinstance(freq, torch.Tensor):
            setattr(rotary, b, freq / div)


def _example_inputs(config, layer: int | None, seq_len: int, dtype: torch.dtype) -> tuple:
    """Token ids (1, S) for the whole model, hidden states (1, S, hidden) for one layer."""
    gen = torch.Generator().manual_seed(SEED)
    if layer is None:
        return (torch.randint(0, config.vocab_size, (1, seq_len), generator=gen),)
    return (torch.randn((1, seq_len, config.hidden_size), generator=gen).to(dtype),)


def _materialise(lm: nn.Module, part: nn.Module) -> None:
    """Allocate `part` (and the rotary embedding) on the CPU; recompute non-persistent buffers."""
    part.to_empty(device="cpu")
    rotary = getattr(getattr(lm, "model", None), "rotary_emb", None)
    if rotary is not None and part is not lm:
        rotary.to_empty(device="cpu")
    for name, mod in lm.named_modules():
        kept = getattr(mod, "_non_persistent_buffers_set", ())
        if not kept or all(mod._buffers[b] is None or mod._buffers[b].is_meta for b in kept):
            continue
        cfg = getattr(mod, "config", None)
        if cfg is None:
            raise ModelError(f"cannot recompute the buffers {sorted(kept)} of {name} "
                             f"({type(mod).__name__}) after materialising the model")
        with torch.device("cpu"):
            fresh = type(mod)(config=cfg)
        for b in kept:
            mod._buffers[b] = fresh._buffers[b]


def _random_weights(lm: nn.Module, part: nn.Module, prefix: str, config) -> None:
    """N(0, initializer_range) matrices and biases, ones for norm weights; each tensor from its
    own generator seeded by SEED and its name."""
    std = float(getattr(config, "initializer_range", 0.02))
    with torch.no_grad():
        for name, p in part.named_parameters():
            full = prefix + name
            if p.dim() == 1 and "norm" in full:
                p.fill_(1.0)
                continue
            gen = torch.Generator().manual_seed(SEED * 1_000_003 + zlib.crc32(full.encode()))
            p.copy_(torch.randn(p.shape, generator=gen) * std)
