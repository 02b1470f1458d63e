"""Where a model comes from: a MODEL argument is a bundled name, a local directory or a GGUF file.

The bundled configs in configs/ are the published config.json of each model, transcribed by hand
(no network here, ever) and named `<org>--<name>.json`. A directory must hold a config.json and
may hold safetensors weights (one file, or shards with model.safetensors.index.json). A directory
wins over a bundled name of the same spelling, so a local copy of `Qwen/Qwen2.5-7B` with its
weights is used as such. A GGUF file (llama.cpp's format, gguf_file.py) carries its config as
metadata, read into the same config.json form.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ModelError

CONFIG_DIR = Path(__file__).parent / "configs"


def bundled_names() -> list[str]:
    """The bundled model names, as Hugging Face spells them ("Qwen/Qwen2.5-7B")."""
    return sorted(p.stem.replace("--", "/", 1) for p in CONFIG_DIR.glob("*.json"))


@dataclass
class ModelSource:
    name: str                     # as the user wrote it
    config: dict                  # the raw config.json
    directory: Path | None        # None for a bundled config or a GGUF file
    gguf: object = None           # the open gguf_file.GGUFFile for a GGUF file

    @property
    def description(self) -> str:
        if self.gguf is not None:
            return self.gguf.description
        return "bundled config" if self.directory is None else f"directory {self.directory}"


def _read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read {path}: {e}") from None


def resolve(model: str) -> ModelSource:
    """The config (and directory, if any) a MODEL argument names."""
    path = Path(os.path.expanduser(model))
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise ModelError(f"{model} is a directory without a config.json; a model directory "
                             f"needs one (and optionally *.safetensors weights)")
        return ModelSource(model, _read_json(cfg), path)
    if path.is_file():
        from . import gguf_file
        if not gguf_file.is_gguf(path):
            raise ModelError(f"{model} is a file but not a GGUF file; MODEL is a .gguf file, a "
                             f"directory with a config.json or a bundled name")
        opened = gguf_file.GGUFFile(path)
        return ModelSource(model, opened.config_dict(), None, opened)
    if _looks_like_a_path(model):
        raise ModelError(f"{model}: no such file or directory")
    by_lower = {n.lower(): n for n in bundled_names()}
    name = by_lower.get(model.lower())
    if name is None:
        raise ModelError(f"unknown model {model!r}: give a local directory with a config.json or "
                         f"one of the bundled names: {', '.join(bundled_names())}")
    return ModelSource(model, _read_json(CONFIG_DIR / (name.replace("/", "--", 1) + ".json")), None)


def _looks_like_a_path(model: str) -> bool:
    """Whether a MODEL that names nothing here was meant as a file or directory (a .gguf name, an
    absolute or ./ path, two slashes), not as a bundled "org/name" a typo away."""
    return (model.lower().endswith(".gguf") or model.startswith(("/", ".", "~"))
            or model.count("/") > 1)


def hf_config(source: ModelSource):
    """The transformers config object of a source (imports transformers)."""
    from .hf import major_version, transformers
    raw = dict(source.config)
    model_type = raw.pop("model_type", None)
    if model_type is None:
        raise ModelError(f"{source.name}: config.json has no model_type")
    if major_version() >= 5 and "torch_dtype" in raw:      # renamed in transformers 5
        raw["dtype"] = raw.pop("torch_dtype")
    try:       # the sizes first: transformers 5 rejects its defaults mixed with the given ones
        _check_sizes(source, transformers().AutoConfig.for_model(model_type), raw)
        return transformers().AutoConfig.for_model(model_type, **raw)
    except (ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{source.name}: transformers cannot read this config "
                         f"(model_type {model_type!r}): {e}") from None


# The sizes that make a model what it is: a config without them would silently be transformers'
# default model of that type (a 32-layer 7B for "llama"), which nobody means.
SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _check_sizes(source: ModelSource, config, raw: dict) -> None:
    """Name every size `raw` lacks, with the default of `config` (the model type's defaults)."""
    aliases = {v: k for k, v in getattr(config, "attribute_map", {}).items()}
    given = set(raw) | {aliases.get(k, k) for k in raw}
    missing = [f"{k} (default {getattr(config, k)})" for k in SIZES
               if k not in given and hasattr(config, k)]
    if missing:
        raise ModelError(f"{source.name}: config.json does not give {', '.join(missing)}; strata "
                         f"will not guess a model's size from transformers' defaults: write them "
                         f"into config.json")
