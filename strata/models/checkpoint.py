"""safetensors checkpoints: find the files, check every tensor against the model the config
describes, and load them with dtype conversion.

A checkpoint is `model.safetensors`, or shards listed by `model.safetensors.index.json`, or else
every `*.safetensors` file of the directory. Checking reads only the file headers (names and
shapes), so `strata compile` validates a 7B checkpoint without reading its 15 GB. A tensor the
model needs and the checkpoint lacks, one the model does not have, or a shape that differs is a
`CheckpointMismatch` naming the tensor. Tied embeddings: a checkpoint of a model with
`tie_word_embeddings` may omit `lm_head.weight` (the input embedding is reused).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.errors import CheckpointMismatch, ModelError

INDEX = "model.safetensors.index.json"
# Tensors older checkpoints carry that are recomputed from the config, never loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class Checkpoint:
    directory: Path
    files: list[Path]                       # safetensors files, in load order
    shapes: dict[str, tuple[int, ...]]      # tensor name -> shape (from the headers)
    where: dict[str, Path]                  # tensor name -> the file holding it

    @property
    def description(self) -> str:
        n = len(self.files)
        return f"{n} safetensors file{'s' if n != 1 else ''} in {self.directory}"


def find(directory: Path | None) -> Checkpoint | None:
    """The checkpoint in `directory`, or None when it holds no safetensors file."""
    if directory is None:
        return None
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelError(f"cannot read {index}: {e}") from None
        files = [directory / f for f in dict.fromkeys(weight_map.values())]
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise CheckpointMismatch(f"{index} lists {missing[0].name}, which is not in {directory}")
    elif (directory / "model.safetensors").is_file():
        files = [directory / "model.safetensors"]
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    shapes, where = {}, {}
    for f in files:
        for name, shape in _header(f).items():
            shapes[name], where[name] = shape, f
    return Checkpoint(directory, files, shapes, where)


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:       # safetensors raises its own error types
        raise ModelError(f"cannot read safetensors file {path}: {e}") from None


def expected(model: nn.Module, tied: bool) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(name -> shape of every tensor the model loads, names a checkpoint may omit)."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    optional = set()
    if tied:
        out = model.get_output_embeddings()
        for name, p in model.named_parameters(remove_duplicate=False):
            if out is not None and p is out.weight and name in shapes:
                optional.add(name)
    return shapes, optional


def check(ckpt: Checkpoint, model: nn.Module, tied: bool, only: str | None = None) -> list[str]:
    """The names to load, after checking the checkpoint against the model (shapes only).

    only: a name prefix ("model.layers.3.") when a single layer is built; tensors outside it are
    neither needed nor loaded (but still must exist in the model)."""
    want, optional = expected(model, tied)
    for name, shape in ckpt.shapes.items():
        if name.endswith(IGNORED_SUFFIXES):
            continue
        if name not in want:
            raise CheckpointMismatch(f"checkpoint tensor {name} ({ckpt.where[name].name}) is not "
                                     f"a tensor of the model its config describes")
        if shape != want[name]:
            raise CheckpointMismatch(f"checkpoint tensor {name} has shape {list(shape)} but the "
                                     f"config gives {list(want[name])}")
    for name, shape in want.items():
        if name not in ckpt.shapes and name not in optional:
            raise CheckpointMismatch(f"the checkpoint has no tensor {name} (shape {list(shape)}) "
                                     f"that the config needs")
    names = [n for n in ckpt.shapes if n in want]
    return [n for n in names if only is None or n.startswith(only)]


def load(ckpt: Checkpoint, params: dict[str, torch.Tensor], names: list[str]) -> None:
    """Copy tensors `names` into `params` (name -> materialised tensor of the model's dtype;
    copy_ converts), one file open at a time."""
    from safetensors import safe_open
    by_file: dict[Path, list[str]] = {}
    for n in names:
        by_file.setdefault(ckpt.where[n], []).append(n)
    with torch.no_grad():
        for path, group in by_file.items():
            with safe_open(str(path), framework="pt") as f:
                for n in group:
                    params[n].copy_(f.get_tensor(n))
