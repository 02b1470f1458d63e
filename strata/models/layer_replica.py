"""Capture a decoder of N identical layers by exporting it with two and repeating the second.

Why: torch.export of a whole model is most of its cold compile (30 identical layers traced 30
times, then retraced by the decompositions). Layer 1 of a two-layer export is the template of
every later layer: the same ops, reading its own weights and cache tensors, and the previous
layer's values where layer 1 reads layer 0's. Layers 2..N-1 are copies of it with those
references moved, placed before the nodes after the layers (final norm, head), which are then
pointed at the last layer. Nothing is guessed: a node belongs to a layer by the nn.Module it ran
in (`TorchNode.module`, from torch.export), layers 0 and 1 must hold the same ops in the same
order with the same kinds of references, and anything else (a model whose layers differ) is a
plain whole-model capture, which the caller falls back to.
"""
from __future__ import annotations

import dataclasses
import re

from torch import nn

from ..frontend.torch_ir import Ref, TorchProgram
from .compile_cache import owner_names

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def layer_of(module_path: str) -> int | None:
    m = _LAYER.search(module_path)
    return int(m.group(1)) if m else None


def same_layers(layers: nn.ModuleList, config=None) -> bool:
    """Every layer is the first one's twin: the same module classes, parameter and buffer
    shapes and dtypes (a QuantLinear's qs and d), and plain attributes (eps, sliding window,
    scaling, a quantization format: all but layer_idx); and the config gives every layer one
    type (a model alternating sliding and full attention is not one template)."""
    if len(set(getattr(config, "layer_types", None) or ())) > 1:
        return False

    def fingerprint(layer):
        mods = [(name, type(m), sorted((k, v) for k, v in vars(m).items()
                                       if not k.startswith("_") and k not in ("layer_idx", "training")
                                       and isinstance(v, (bool, int, float, str, type(None)))))
                for name, m in layer.named_modules()]
        return mods, [(n, tuple(t.shape), t.dtype)
                      for n, t in [*layer.named_parameters(), *layer.named_buffers()]]
    first = fingerprint(layers[0])
    return all(fingerprint(layer) == first for layer in layers[1:])


def _map_refs(value, fn):
    if isinstance(value, Ref):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_refs(x, fn) for x in value)
    if isinstance(value, dict):
        return {k: _map_refs(v, fn) for k, v in value.items()}
    return value


def _refs(value) -> list[str]:
    out = []
    _map_refs(value, lambda r: out.append(r.name) or r)
    return out


def replicate(two: TorchProgram, layers: nn.ModuleList, layer_inputs) -> TorchProgram | None:
    """The Torch IR of the whole model from `two`, captured with layers[:2]; None when its two
    layers are not one template. layer_inputs(k): the names of layer k's own inputs (its K and V
    caches), in the order the program takes them."""
    n_layers = len(layers)
    nodes = two.nodes
    where = {n.name: layer_of(n.module) for n in nodes}
    l0 = [n for n in nodes if where[n.name] == 0]
    l1 = [n for n in nodes if where[n.name] == 1]
    if not l1 or len(l0) != len(l1) or any(a.op != b.op for a, b in zip(l0, l1)):
        return None
    pos = {n.name: i for i, n in enumerate(l1)}
    by_pos0 = {n.name: i for i, n in enumerate(l0)}
    own_inputs = dict(zip(layer_inputs(1), layer_inputs(0)))
    w1 = owner_names(layers[1], two.weights)
    w0 = owner_names(layers[0], two.weights)
    # layer 1 reads: its own nodes, layer 0's nodes (the previous layer), its weights and inputs,
    # and shared values; layer 0 must read the same kinds at the same places
    for a, b in zip(l0, l1):
        ra, rb = _refs((a.args, a.kwargs)), _refs((b.args, b.kwargs))
        if len(ra) != len(rb):
            return None
        for x, y in zip(ra, rb):
            if y in pos and by_pos0.get(x) != pos[y]:
                return None
            if y in w1 and (x not in w0 or w0[x] != w1[y]):
                return None
            if y in own_inputs and own_inputs[y] != x:
                return None
            if where.get(y) == 0 and where.get(x) is not None:
                return None         # layer 1 reads layer 0 where layer 0 reads itself: no template
            shared = y not in pos and y not in w1 and y not in own_inputs and where.get(y) is None
            if shared and x != y:
                return None
    outside_reads_l0 = [n for n in nodes if where[n.name] is None and
                        any(where.get(r) == 0 for r in _refs((n.args, n.kwargs)))]
    if outside_reads_l0 or layer_inputs(n_layers - 1) is None:
        return None
    taken = {n.name for n in nodes} | set(two.inputs) | set(two.weights)
    weights, weight_types = dict(two.weights), dict(two.weight_types)
    inputs = dict(two.inputs)
    mutations = dict(two.mutations)
    clones: list = []
    prev = {n.name: n.name for n in l1}                      # layer-1 name -> layer k-1's
    for k in range(2, n_layers):
        own = dict(zip(layer_inputs(1), layer_inputs(k)))
        state = dict(layers[k].named_parameters(remove_duplicate=False))
        state.update(layers[k].named_buffers(remove_duplicate=False))
        rename_w = {}
        for name, owner in w1.items():
            new = re.sub(r"(^|_)layers_1_", rf"\g<1>layers_{k}_", name)
            mine = state[owner].detach()
            if new in weights and weights[new].data_ptr() == mine.data_ptr():
                rename_w[name] = new          # export lifted every parameter, used or not
                continue
            if new == name or new in taken:
                new = f"{name}_L{k}"
            rename_w[name] = new
            weights[new], weight_types[new] = mine, two.weight_types[name]
            taken.add(new)
        for one, kth in own.items():
            inputs[kth] = two.inputs[one]
        current = {}
        for n in l1:
            new = f"{n.name}_L{k}"
            while new in taken:
                new += "_"
            taken.add(new)
            current[n.name] = new

        def move(r: Ref, current=current, own=own, rename_w=rename_w) -> Ref:
            if r.name in current:
                return Ref(current[r.name])
            if r.name in rename_w:
                return Ref(rename_w[r.name])
            if r.name in own:
                return Ref(own[r.name])
            if where.get(r.name) == 0:                       # the previous layer's value
                return Ref(prev[l1[by_pos0[r.name]].name])
            return r
        clones += [dataclasses.replace(n, name=current[n.name],
                                       args=_map_refs(n.args, move), kwargs=_map_refs(n.kwargs, move),
                                       module=re.sub(r"(^|\.)layers\.1(\.|$)", rf"\g<1>layers.{k}\2",
                                                     n.module))
                   for n in l1]
        for one, kth in own.items():
            if one in two.mutations:
                mutations[kth] = current[two.mutations[one]]
        prev = current
    last = prev

    def to_last(r: Ref) -> Ref:
        return Ref(last[r.name]) if r.name in last else r
    end = max(i for i, n in enumerate(nodes) if where[n.name] == 1)
    after = [dataclasses.replace(n, args=_map_refs(n.args, to_last), kwargs=_map_refs(n.kwargs, to_last))
             for n in nodes[end + 1:]]
    order = _call_order(two.inputs, layer_inputs, n_layers)
    return dataclasses.replace(
        two, graph=None, exported=None, nodes=[*nodes[:end + 1], *clones, *after],
        inputs={name: inputs[name] for name in order}, weights=weights, weight_types=weight_types,
        outputs=[last.get(o, o) for o in two.outputs], mutations=mutations,
        notes=[*two.notes, f"layers 2..{n_layers - 1} repeat layer 1 of a two-layer export"])


def _call_order(two_inputs: dict, layer_inputs, n_layers: int) -> list[str]:
    """The inputs in call order: the shared ones first as captured, then every layer's own."""
    own = set(layer_inputs(0)) | set(layer_inputs(1))
    shared = [n for n in two_inputs if n not in own]
    return shared + [n for k in range(n_layers) for n in layer_inputs(k)]
