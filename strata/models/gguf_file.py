"""Llama-family GGUF files (llama.cpp's format) as transformers Llama models.

Why: users run LLMs quantized in GGUF files. A file holds the config as `llama.*` metadata and the
tensors under llama.cpp's names, quantized ones as blocks of 32 weights (an fp16 scale, then the
packed values). Reading maps the metadata to a LlamaConfig (source.py makes it the MODEL's config),
checks every tensor's name, type and shape, and build.py then makes each linear layer whose weight
is Q8_0, Q4_0, Q4_K, Q5_K or Q6_K a QuantLinear (strata/quant/formats.py) holding the file's blocks
split into parts (qs, d; a K-quant's unpacked scales): no float copy of a quantized weight is made. Float tensors (F32, F16, BF16) load as any
checkpoint does; an embedding stored quantized is dequantized (a lookup table, not a matmul).
Q4_K, Q5_K and Q6_K (the Q4_K_M and Q5_K_M files people download) become QuantLinears of their
parts (quant/kquants.py: the blocks split and their scales unpacked at load); the other K-quants
(Q2_K, Q3_K) are dequantized at load by the gguf package into float weights of the activations'
type: they run as bf16 linears, correct but at bf16's speed.
llama.cpp's converter permutes the rows of attn_q and attn_k for its rope layout; loading undoes
it on whole rows, so quantized rows move as they are. The file is memory-mapped (gguf.GGUFReader):
reading the config touches the header only.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
from torch import nn

from ..core.errors import CheckpointMismatch, ModelError
from ..quant.formats import BLOCK, BYTES_PER_BLOCK, QuantLinear, dequantize
from ..quant.kquants import BYTES, PARTS, QK_K, split_kquant
from .gguf_names import gguf_name, hf_name, rope_rows
from .hf import transformers

MAGIC = b"GGUF"
FLOAT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
QUANT = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k"}   # -> quant.formats
KQUANT = ("Q2_K", "Q3_K")                            # dequantized at load
DTYPE_NAME = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
ROPE_FREQS = "rope_freqs.weight"       # Llama-3 rope scaling: per-frequency divisors


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


class GGUFFile:
    """An open llama GGUF file: its metadata, tensors by transformers name, and the config."""

    def __init__(self, path: Path):
        self.path, self.name = Path(path), Path(path).name
        try:
            reader = _reader(self.path)
        except ModelError:
            raise
        except Exception as e:               # numpy/gguf raise many kinds on a bad header
            raise ModelError(f"{self.name} is not a readable GGUF file (truncated or corrupt: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        # Kept: the scalars, arrays up to per-layer sizes, and every array's length. The reader
        # holds a numpy view per array item, 130 MB for a 49k-token vocabulary: it goes with
        # __init__.
        self.meta = {k: f.contents() for k, f in reader.fields.items() if len(f.data) <= 1024}
        self.lengths = {k: len(f.data) for k, f in reader.fields.items()}
        arch = self.value("general.architecture")
        if arch is None:
            raise ModelError(f"{self.name}: the metadata has no general.architecture; strata "
                             f"reads llama GGUF files")
        if arch != "llama":
            raise ModelError(f"{self.name}: architecture {arch!r}; strata reads llama GGUF files "
                             f"(Llama, Mistral, TinyLlama, SmolLM ...)")
        self.tensors = {}                   # hf name -> ReaderTensor
        self.rope_freqs = None
        for t in reader.tensors:
            kind = t.tensor_type.name
            if kind not in FLOAT and kind not in QUANT and kind not in KQUANT:
                raise ModelError(f"{self.name}: tensor {t.name} is {kind}; strata reads F32, F16, "
                                 f"BF16, Q8_0, Q4_0 and the K-quants Q2_K to Q6_K")
            if t.name == ROPE_FREQS:
                self.rope_freqs = t
                continue
            name = hf_name(t.name)
            if name is None:
                raise CheckpointMismatch(f"{self.name}: tensor {t.name} is not one of a llama "
                                         f"model's tensors")
            self.tensors[name] = t
        self.types = _types(self.tensors.values())

    def value(self, key: str, default=None):
        return self.meta.get(key, default)

    def release(self) -> None:
        """Unmap the file once the weights are loaded (its pages would count as memory in use);
        the tensors are gone from this object after."""
        self.tensors, self.rope_freqs = {}, None

    def _need(self, key: str, default=None):
        """A metadata value that must be there (or has a default), one for every layer."""
        v = self.value(key, default)
        if v is None:
            raise ModelError(f"{self.name}: the metadata has no {key}, which a llama GGUF file "
                             f"gives")
        if isinstance(v, list):             # per-layer counts: strata builds uniform layers
            if len(set(v)) != 1:
                raise ModelError(f"{self.name}: {key} differs between layers; strata builds "
                                 f"llama models whose layers are alike")
            v = v[0]
        return v

    @property
    def description(self) -> str:
        return f"GGUF file {self.path}, {self.types}"

    def config_dict(self) -> dict:
        """The config.json a transformers LlamaConfig is made from (source.hf_config)."""
        p = "llama."
        heads = self._need(p + "attention.head_count")
        hidden = self._need(p + "embedding_length")
        embed = self.tensors.get("model.embed_tokens.weight")
        vocab = (self.lengths.get("tokenizer.ggml.tokens") or self.value(p + "vocab_size")
                 or (int(embed.shape[1]) if embed is not None else None))
        if vocab is None:
            raise ModelError(f"{self.name}: neither a token list nor token_embd.weight gives "
                             f"the vocabulary size")
        kind = embed.tensor_type.name if embed is not None else "F32"
        raw = dict(model_type="llama", hidden_size=int(hidden), num_attention_heads=int(heads),
                   num_hidden_layers=int(self._need(p + "block_count")),
                   intermediate_size=int(self._need(p + "feed_forward_length")),
                   num_key_value_heads=int(self._need(p + "attention.head_count_kv", heads)),
                   rope_theta=float(self.value(p + "rope.freq_base", 10000.0)),
                   rms_norm_eps=float(self.value(p + "attention.layer_norm_rms_epsilon", 1e-5)),
                   max_position_embeddings=int(self.value(p + "context_length", 2048)),
                   vocab_size=int(vocab), tie_word_embeddings="lm_head.weight" not in self.tensors,
                   attention_bias=any(n.endswith("q_proj.bias") for n in self.tensors),
                   mlp_bias=any(n.endswith("up_proj.bias") for n in self.tensors),
                   torch_dtype=self._activations(kind))
        head_dim = self.value(p + "attention.key_length")
        if head_dim is not None and int(head_dim) != hidden // heads:
            raw["head_dim"] = int(head_dim)
        for key in ("bos", "eos"):
            tid = self.value(f"tokenizer.ggml.{key}_token_id")
            if tid is not None:
                raw[f"{key}_token_id"] = int(tid)
        return raw

    def _activations(self, kind: str) -> str:
        """The embedding's float type; bfloat16 where the linear weights are quantized: Q8_0/Q4_0 rows
        then run as int8 products where the CPU has AVX512-VNNI, or AVX2 without AVX-512, the
        activations rounded to 8 bits a block as llama.cpp rounds them (QDOT=vnni). float32 rows
        keep the float lanes: a TinyLlama Q4_0 decode on Zen 3 ran 18.5 tokens/s so, 35.8 in bf16."""
        if any(t.tensor_type.name in (*QUANT, *KQUANT) for t in self.tensors.values()):
            return "bfloat16"
        return DTYPE_NAME.get(kind, "float32")

    def shape(self, name: str) -> tuple[int, ...]:
        """The logical torch shape of a tensor (GGUF lists dimensions innermost first)."""
        return tuple(int(x) for x in reversed(self.tensors[name].shape.tolist()))

    def check(self, model: nn.Module, tied: bool, only: str | None = None) -> list[str]:
        """The names to load (those starting with `only`, when given), after checking every
        tensor of the model against the file: present and of the same shape."""
        want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        for name, shape in want.items():
            if name not in self.tensors:
                if tied and name == "lm_head.weight":
                    continue
                raise CheckpointMismatch(f"{self.name} has no tensor {gguf_name(name)} (shape "
                                         f"{list(shape)}) that its llama config needs")
            if self.shape(name) != shape:
                raise CheckpointMismatch(f"{self.name}: tensor {gguf_name(name)} has shape "
                                         f"{list(self.shape(name))} but the config gives "
                                         f"{list(shape)}")
        extra = [n for n in self.tensors if n not in want]
        if extra:
            raise CheckpointMismatch(f"{self.name}: tensor {gguf_name(extra[0])} is not a tensor of "
                                     f"the llama model its metadata describes")
        return [n for n in self.tensors if only is None or n.startswith(only)]

    def quantized_layout(self, model: nn.Module) -> list[str]:
        """Make every linear layer whose weight is Q8_0/Q4_0/Q4_K/Q6_K a QuantLinear with empty parts on
        the weight's device (meta or fake: load() fills them); the names of those layers."""
        packed = {"q8_0": (torch.int8, BLOCK), "q4_0": (torch.uint8, BLOCK // 2)}
        done = []
        for name, t in self.tensors.items():
            mod_name = name.removesuffix(".weight")
            if t.tensor_type.name not in QUANT or name == "model.embed_tokens.weight":
                continue
            parent, _, child = mod_name.rpartition(".")
            linear = model.get_submodule(mod_name)
            w = linear.weight
            n, k = w.shape
            fmt = QUANT[t.tensor_type.name]
            bias = None if linear.bias is None else linear.bias.detach()
            if fmt in PARTS:                # the parts' shapes and types, from one row's
                one = split_kquant(torch.zeros((1, k // QK_K * BYTES[fmt.upper()]), dtype=torch.uint8), fmt)
                parts = {p: torch.empty((n, *v.shape[1:]), dtype=v.dtype, device=w.device)
                         for p, v in one.items()}
                layer = QuantLinear(fmt, k, bias=bias, **parts)
            else:
                dtype, width = packed[fmt]
                layer = QuantLinear(fmt, k, torch.empty((n, k // BLOCK, width), dtype=dtype,
                                                        device=w.device),
                                    torch.empty((n, k // BLOCK, 1), dtype=torch.float16,
                                                device=w.device), bias)
            setattr(model.get_submodule(parent) if parent else model, child, layer)
            done.append(mod_name)
        return done

    def load(self, state: dict[str, torch.Tensor], names: list[str], config) -> list[str]:
        """Copy tensors `names` into `state` (name -> materialised tensor: a parameter, or a
        QuantLinear's `qs`/`d`); the notes worth telling the user (a dequantized embedding)."""
        notes, kquants = [], {}
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        with torch.no_grad():
            for name in names:
                t = self.tensors[name]
                kind = t.tensor_type.name
                rows = _torch(t.data)
                if name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
                    rows = rope_rows(rows, heads if ".q_proj" in name else kv_heads, to_gguf=False)
                if kind in FLOAT:
                    w = rows.view(FLOAT[kind]) if kind == "BF16" else rows
                    state[name].copy_(w.reshape(state[name].shape))
                    continue
                if kind in KQUANT:
                    _dequantize_kquant_into(state[name], rows, t.tensor_type)
                    kquants[kind], dtype = kquants.get(kind, 0) + 1, state[name].dtype
                    continue
                fmt = QUANT[kind]
                if name in state:           # the embedding: a lookup table, dequantized
                    if fmt in PARTS:
                        _dequantize_kquant_into(state[name], rows, t.tensor_type)
                    else:
                        _dequantize_into(state[name], *split_blocks(rows, fmt), fmt)
                    notes.append(f"{gguf_name(name)} is {kind}, dequantized to "
                                 f"{str(state[name].dtype).removeprefix('torch.')} for the lookup")
                    continue
                prefix = name.removesuffix(".weight")
                parts = split_kquant(rows, fmt) if fmt in PARTS else \
                    dict(zip(("qs", "d"), split_blocks(rows, fmt)))
                for part, value in parts.items():
                    state[f"{prefix}.{part}"].copy_(value)
        if kquants:
            dtype = str(dtype).removeprefix("torch.")
            notes.append(f"{' and '.join(f'{n} {k}' for k, n in kquants.items())} tensors "
                         f"dequantized to {dtype} at load (strata has no fused K-quant rows yet: "
                         f"they run as {dtype} weights)")
        return notes

    def tokenizer(self):
        """transformers' tokenizer built from the file's tokenizer.ggml.* metadata (its own GGUF
        converter), or None with `tokenizer_problem` saying why."""
        kind = self.value("tokenizer.ggml.model")
        self.tokenizer_problem = f"this file's tokenizer ({kind!r}) is not supported yet"
        if kind is None:
            self.tokenizer_problem = "this GGUF file has no tokenizer (no tokenizer.ggml.model)"
            return None
        try:
            return transformers().AutoTokenizer.from_pretrained(
                str(self.path.parent), gguf_file=self.name, local_files_only=True)
        except Exception:           # transformers' converters raise anything on what they lack
            return None

    def rope_divisors(self) -> torch.Tensor | None:
        """Llama-3 rope scaling as llama.cpp stores it: inv_freq[i] is divided by these."""
        return None if self.rope_freqs is None else _torch(self.rope_freqs.data).float().clone()


def _reader(path: Path):
    """gguf.GGUFReader(path), a tensor whose bytes run past the end of the file named first: the
    reader's own error for a cut download is numpy's "cannot reshape array of size ..."."""
    import gguf                          # the gguf package: imported only for GGUF files

    class Reader(gguf.GGUFReader):
        def _build_tensors(self, start, fields):
            for f in fields:             # parts: name length, name, dims count, dims, type, offset
                _, name, _, dims, kind, offset = f.parts
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(kind[0]))]
                at, n = start + int(offset[0]), math.prod(dims.tolist()) * size // block
                if at + n > len(self.data):
                    raise ModelError(f"{path.name} is truncated: tensor {bytes(name).decode()} "
                                     f"needs {n} bytes at offset {at}, but the file ends at byte "
                                     f"{len(self.data)} (download it again)")
            super()._build_tensors(start, fields)
    return Reader(str(path), "r")


def _types(tensors) -> str:
    """The tensor types of a file, most frequent first ("Q8_0 and F32")."""
    count: dict[str, int] = {}
    for t in tensors:
        count[t.tensor_type.name] = count.get(t.tensor_type.name, 0) + 1
    names = sorted(count, key=lambda k: -count[k])
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def _dequantize_into(out: torch.Tensor, qs, d, fmt: str, rows: int = 4096) -> None:
    """out[:] = the dequantized weight, a few thousand rows at a time (a 128k-token embedding
    would otherwise pass through two float32 temporaries of its full size)."""
    for r in range(0, out.shape[0], rows):
        out[r:r + rows].copy_(dequantize(qs[r:r + rows], d[r:r + rows], fmt)[:, :out.shape[1]])


def _dequantize_kquant_into(out: torch.Tensor, rows: torch.Tensor, kind, chunk: int = 1024) -> None:
    """out[:] = the gguf package's dequantization of K-quant block rows, `chunk` rows at a time."""
    from gguf.quants import dequantize as gguf_dequantize
    for r in range(0, out.shape[0], chunk):
        part = gguf_dequantize(rows[r:r + chunk].numpy(), kind)
        out[r:r + chunk].copy_(torch.from_numpy(part).reshape(out[r:r + chunk].shape))


def split_blocks(rows: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(qs, d) views of GGUF block rows [N, K/32 * bytes per block]: each block is d (fp16, 2
    bytes) then the packed weights."""
    blocks = rows.view(torch.uint8).reshape(rows.shape[0], -1, BYTES_PER_BLOCK[fmt])
    d = blocks[..., :2].contiguous().view(torch.float16)
    qs = blocks[..., 2:]
    return (qs.view(torch.int8) if fmt == "q8_0" else qs), d


def _torch(array) -> torch.Tensor:
    """A torch view of a (read-only, memory-mapped) numpy array; nothing writes to it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # "the given NumPy array is not writable"
        return torch.from_numpy(array)
