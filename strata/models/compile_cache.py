"""A persistent cache of a model's compiled programs (prefill and decode step), so the second
`strata generate` of a model skips torch.export and every stage of lowering.

Why: a whole model spends most of its compile in torch.export (about two thirds) and the rest in
lowering 30-odd identical layers; the native libraries were already cached by source. An entry
holds what running needs: the Torch IR (without the fx graph), the Kernel IR and the emitted
source. Weights are not stored: each is recorded as the name of the model's parameter or buffer
that holds it and taken from the model at load (so a real checkpoint is not copied, and new
weights of the same architecture reuse the entry); a constant that belongs to no parameter (a
few small tensors) is stored by value. The key covers the model's class and config, the name,
shape and dtype of every parameter and buffer (a quantized model's qs and d too) and its modules'
classes, the input shapes, the target, knobs and tuning database, the torch and Python versions
and the source of all of strata, so any change recompiles. Entries are written atomically; an unreadable one
is recompiled and replaced, never fatal. torch.compile's backend keeps its graphs' programs here
too (store_entry/load_entry, their weights named by graph input: torch_compile/saved_graphs.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import pickle
import sys
from functools import lru_cache
from pathlib import Path

import torch

from ..core.user_cache import caching_enabled, user_cache_dir, write_atomically
from ..frontend.capture_cache import _from_plain, _to_plain
from ..pipeline import Lowered
from ..tensor.merge_projections import derive_weights, merging
from ..version import source_digest

log = logging.getLogger("strata.compile_cache")
FORMAT = 4                  # 2: derived weights made again when loaded; 3: Lowered.units; 4: extra
MAX_VALUE_BYTES = 64 << 20       # constants stored by value above this: not cached


@lru_cache(maxsize=1)
def _strata_digest() -> str:
    return source_digest()


def _tuning_digest(ctx) -> str:
    path = getattr(getattr(ctx, "tuned", None), "path", None)
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else "none"
    except OSError:
        return "none"


def cache_key(model, label: str, example_inputs, ctx, sampling) -> str:
    config = model.config.to_json_string(use_diff=False) if hasattr(model.config, "to_json_string") \
        else repr(model.config)
    shapes = [(tuple(x.shape), str(x.dtype)) for x in example_inputs]
    return digest(ctx, type(model).__qualname__, config, label, repr(shapes), _state_digest(model),
                  repr(sampling))


def digest(ctx, *parts: str) -> str:
    """The key of an entry: `parts` and what every entry depends on (this format, torch, Python,
    strata's source, the target, knobs and tuning database, whether projections merge)."""
    common = [f"format={FORMAT}", f"torch={torch.__version__}", f"python={sys.version_info[:2]}",
              f"strata={_strata_digest()}", str(ctx.arch), repr(sorted(ctx.knobs.items())),
              f"tuned={_tuning_digest(ctx)}", f"merge={merging()}"]
    return hashlib.sha256("\0".join([*common, *parts]).encode()).hexdigest()


def _state_digest(model) -> str:
    """Every parameter's and buffer's name, shape and dtype, and every module's class and plain
    attributes: a quantized model (QuantLinear's qs and d buffers, its format) and a float one
    of the same config are different programs."""
    h = hashlib.sha256()
    for name, t in [*model.named_parameters(remove_duplicate=False),
                    *model.named_buffers(remove_duplicate=False)]:
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
    for name, m in model.named_modules():
        plain = sorted((k, v) for k, v in vars(m).items() if not k.startswith("_")
                       and isinstance(v, (bool, int, float, str, type(None))))
        h.update(f"{name}:{type(m).__qualname__}:{plain};".encode())
    return h.hexdigest()


def _path(key: str) -> Path:
    return user_cache_dir() / "models" / key[:2] / f"{key}.pkl"


def owner_names(module: torch.nn.Module, tensors: dict) -> dict[str, str]:
    """name -> the qualified name of the parameter or buffer of `module` that is that tensor (the
    same object, or the same storage, shape, strides and dtype: export detaches them), for the
    tensors `module` holds; the first name of a tied one."""
    named = [*module.named_parameters(remove_duplicate=False),
             *module.named_buffers(remove_duplicate=False)]
    ids = {id(t): n for n, t in reversed(named)}
    ptrs = {_storage(t): n for n, t in reversed(named) if t.data_ptr()}
    out = {}
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            owner = ids.get(id(t)) or (ptrs.get(_storage(t)) if t.data_ptr() else None)
            if owner is not None:
                out[name] = owner
    return out


def _storage(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), t.stride(), t.dtype


def store(key: str, lowered, module: torch.nn.Module) -> bool:
    """Write the entry, weights named by the parameter or buffer of `module` holding them."""
    return store_entry(key, lowered, owner_names(module, lowered.torch.weights))


def load(key: str, module: torch.nn.Module):
    """The cached Lowered program with `module`'s weights bound, or None (absent, caching off,
    unreadable, or a weight the model no longer has)."""
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    got = load_entry(key, state)
    return got and got[0]


def store_entry(key: str, lowered, refs: dict, extra=None) -> bool:
    """Write the entry: `refs` names the holder of each weight not stored (load_entry's `state`
    key), `extra` is anything picklable the caller needs back. False (and no entry) when caching
    is off, a constant that belongs to no holder is too big, or the directory is not writable."""
    if not caching_enabled():
        return False
    derived = lowered.torch.derived          # concatenated again from the sources when loaded
    values = {name: t for name, t in lowered.torch.weights.items()
              if name not in refs and name not in derived}
    if sum(t.numel() * t.element_size() for t in values.values()
           if isinstance(t, torch.Tensor)) > MAX_VALUE_BYTES:
        return False
    program = _to_plain(dataclasses.replace(lowered.torch, weights=values))
    entry = {"format": FORMAT, "key": key, "program": program, "refs": refs, "extra": extra,
             "kernel": lowered.kernel, "units": lowered.units, "target": lowered.target}
    path = _path(key)
    try:
        write_atomically(path, pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL))
        return True
    except Exception as e:          # read-only home, full disk, something unpicklable
        log.warning("could not write the compile cache entry %s: %s", path, e)
        return False


def load_entry(key: str, state: dict):
    """(the cached Lowered program, its `extra`) with each weight taken from `state` by the
    holder store_entry named, or None (absent, caching off, unreadable, a holder missing)."""
    if not caching_enabled():
        return None
    path = _path(key)
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f)
        if entry.get("format") != FORMAT or entry.get("key") != key:
            raise ValueError("stale or foreign entry")
        program = _from_plain(entry["program"])
        program.weights.update({name: state[owner] for name, owner in entry["refs"].items()})
        program.weights.update(derive_weights(program))
    except FileNotFoundError:
        return None
    except Exception as e:          # truncated, corrupt, incompatible, or a missing weight
        log.warning("compile cache entry %s is unusable (%s); compiling again", path, e)
        return None
    lowered = Lowered(program, kernel=entry["kernel"], units=entry["units"], target=entry["target"])
    return lowered, entry["extra"]
