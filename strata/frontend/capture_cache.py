"""A persistent cache of captured snippets, so that the second `strata compile -c CODE` skips
torch.export.

Why: the first torch.export in a process imports torch._dynamo (~1 s, more than the whole of
strata's lowering), so a cold `strata compile` cannot go under 2 s; the second time, the Torch IR
is read back in a few milliseconds. Only snippets are cached: their weights are a deterministic
function of the code (seed 0) and small. The key covers the code, the torch and Python versions
and the source of strata's frontend, so a change to any of them recaptures. An entry is pickled
with the op targets as names (OpOverloads do not pickle) and written atomically (temp file +
os.replace); an unreadable entry is recaptured and replaced, never fatal.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import operator
import pickle
import sys
from functools import lru_cache
from pathlib import Path

import torch

from ..core.user_cache import caching_enabled, user_cache_dir, write_atomically
from .torch_ir import TorchProgram

log = logging.getLogger("strata.capture_cache")
FORMAT = 2
MAX_WEIGHT_BYTES = 64 << 20        # bigger snippets are recaptured rather than stored


@lru_cache(maxsize=1)
def _frontend_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def cache_key(code: str) -> str:
    parts = [f"format={FORMAT}", f"torch={torch.__version__}", f"python={sys.version_info[:2]}",
             f"frontend={_frontend_digest()}", code.strip()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def entry_path(code: str) -> Path:
    key = cache_key(code)
    return user_cache_dir() / "capture" / key[:2] / f"{key}.pkl"


def _resolve(op: str):
    """ "aten.add.Tensor" -> torch.ops.aten.add.Tensor; "getitem" -> operator.getitem."""
    if op == "getitem":
        return operator.getitem
    ns, name, overload = op.split(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload)


def _to_plain(p: TorchProgram) -> dict:
    return {
        "nodes": [dataclasses.replace(n, target=None) for n in p.nodes],
        "inputs": p.inputs, "weights": p.weights, "weight_types": p.weight_types,
        "outputs": p.outputs, "mutations": p.mutations, "derived": p.derived,
        "out_spec": None if p.out_spec is None else _dump_spec(p.out_spec),
    }


def _dump_spec(spec) -> str | tuple:
    """treespec_dumps' text, or for a spec it cannot name (torch.return_types.max of
    `x.max(dim=)`, topk) the flat structure as a tuple, which unflattens the same leaves."""
    import torch.utils._pytree as pytree
    try:
        return pytree.treespec_dumps(spec)
    except Exception:
        return ("tuple", spec.num_leaves)


def _from_plain(d: dict) -> TorchProgram:
    import torch.utils._pytree as pytree
    nodes = [dataclasses.replace(n, target=_resolve(n.op)) for n in d["nodes"]]
    spec = d["out_spec"]
    if isinstance(spec, tuple):
        spec = pytree.tree_flatten(tuple(range(spec[1])))[1]
    elif spec is not None:
        spec = pytree.treespec_loads(spec)
    return TorchProgram(None, nodes, d["inputs"], d["weights"], d["weight_types"], d["outputs"], spec,
                        mutations=d["mutations"], derived=d.get("derived", {}))


def load(code: str) -> TorchProgram | None:
    """The cached Torch IR of `code`, or None (absent, caching off, or unreadable)."""
    if not caching_enabled():
        return None
    path = entry_path(code)
    try:
        with open(path, "rb") as f:
            d = pickle.load(f)
        if d.get("format") != FORMAT or d.get("code") != code.strip():
            raise ValueError("stale or foreign entry")
        return _from_plain(d["program"])
    except FileNotFoundError:
        return None
    except Exception as e:          # truncated, corrupt, or from an incompatible version
        log.warning("capture cache entry %s is unreadable (%s); recapturing", path, e)
        return None


def store(code: str, program: TorchProgram) -> bool:
    """Write the entry atomically; False (and no entry) when caching is off, the weights are too
    big, or the directory is not writable."""
    if not caching_enabled():
        return False
    if sum(w.numel() * w.element_size() for w in program.weights.values()) > MAX_WEIGHT_BYTES:
        return False
    path = entry_path(code)
    try:
        write_atomically(path, pickle.dumps({"format": FORMAT, "code": code.strip(),
                                             "program": _to_plain(program)}))
        return True
    except Exception as e:          # read-only home, full disk, an unpicklable constant ...
        log.warning("could not write the capture cache entry %s: %s", path, e)
        return False
