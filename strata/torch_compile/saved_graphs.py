"""torch.compile's graphs compiled once per machine, not once per process.

Why: dynamo hands the backend the same graphs in every process (a script run again, a server
restarted), and capturing and lowering them was most of a first `generate` (a 22-layer decoder
on Zen 4: 20 of 34 s, with the C compiler's libraries already cached by their source). A graph's
program is kept in the compile cache (models/compile_cache.py) under a key made of what the graph
computes for these inputs (frontend/dynamo_key.py: its ops, constants and sizes), each input's
shape, strides and dtype, which inputs are weights, the values of the graph's own tensor
attributes, the backend's options and what every entry depends on (strata's source, torch, the
target, knobs, tuning database). Weights are not stored: each is taken from the call's inputs by
position, so new weights of the same shapes reuse the entry. A graph the key cannot describe (a
submodule call, a size the inputs do not fix) or one that updates dynamo's own attributes (an
optimizer step) is compiled as before, every time.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from functools import reduce

import torch
import torch.utils._pytree as pytree

from ..core.user_cache import caching_enabled
from ..frontend.dynamo_graph import OutputPlan
from ..frontend.dynamo_key import graph_key
from ..models import compile_cache

MAX_ATTR_BYTES = 64 << 20      # a graph attribute hashed into the key; above this: not kept
QUIET = ("verbosity",)         # options that do not change the program


@dataclass
class Saved:
    """What a CompiledGraph needs besides its program (torch_compile/programs.py)."""
    plan: OutputPlan
    slots: list[int]
    weights: dict[int, str]        # input position -> program weight name
    written: list[int]


def key(gm: torch.fx.GraphModule, args, weights: list[int], opts: dict, ctx) -> str | None:
    """The entry's key for `gm` called on `args` (weights: the positions compiled as weights),
    or None when the graph cannot be keyed or caching is off (no work for a key unused)."""
    if not caching_enabled():
        return None
    structure = graph_key(gm, args, set(), attrs=False)
    if structure is None:
        return None
    attrs = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            return None
        if n.op == "get_attr":
            value = reduce(getattr, n.target.split("."), gm)
            if not isinstance(value, torch.Tensor) or value.numel() * value.element_size() > MAX_ATTR_BYTES:
                return None
            attrs.append(_bytes_digest(value))
    layout = [(a.stride(), a.requires_grad) if isinstance(a, torch.Tensor) else None for a in args]
    options = sorted((k, v) for k, v in opts.items() if k not in QUIET)
    return compile_cache.digest(ctx, "torch.compile graph", repr(structure), repr(weights),
                                repr(layout), repr(attrs), repr(options))


def _bytes_digest(t: torch.Tensor) -> str:
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{t.dtype}:{tuple(t.shape)}:{hashlib.sha256(raw).hexdigest()}"


def store(key: str, lowered, saved: Saved) -> bool:
    """Write the entry; False where caching is off or the output structure has no text form."""
    try:        # TreeSpec's own pickle warns when loaded; its text form is stable
        spec = None if saved.plan.spec is None else pytree.treespec_dumps(saved.plan.spec)
    except Exception:  # noqa: BLE001 - a container pytree cannot name
        return False
    plan = (saved.plan.leaves, spec, saved.plan.plain)
    return compile_cache.store_entry(key, lowered, {name: i for i, name in saved.weights.items()},
                                     replace(saved, plan=plan))


def load(key: str, args):
    """(Lowered with the weights of `args` bound, Saved), or None."""
    got = compile_cache.load_entry(key, {i: a for i, a in enumerate(args)
                                         if isinstance(a, torch.Tensor)})
    if got is None:
        return None
    lowered, saved = got
    plan = OutputPlan()
    plan.leaves, spec, plan.plain = saved.plan
    plan.spec = None if spec is None else pytree.treespec_loads(spec)
    return lowered, replace(saved, plan=plan)
