"""Sibling projections as one: linears of one input with weights of one dtype become a single
linear over the weights concatenated along N, and each former output a slice of its result;
quantized ones (QuantLinear: a weight computed from its blocks) where their dequantizations
compute alike, over each block part concatenated (weight_chains.py).

Why: a decoder layer multiplies one normed activation by the q, k and v weights, and another by
gate and up. As one contraction the activation (and a norm fused into its prologue) is read
once, a decode step has fewer kernels, and the GPU's small-N projections (k and v: N = 256 for
TinyLlama) fill the machine: TinyLlama-shaped bf16 decode 1.05x, SmolLM2-135M's 1.04x, the
op suite's MLP at one row 1.11x (bf16) and 1.20x (f32) on a 2-core Zen 4 (2026-11-29).
The concatenated weight is a weight of its own, `derived` from its sources
(TorchProgram.derived), so a source changed later (Program.set_weights, the compile cache
binding another model's weights) is concatenated again (derive_weights); its sources stay
weights, which no node reads any more. Programs made from the same weights share one
concatenation (frontend/derived_weights.py): TinyLlama's first 4 layers through torch.compile's
dynamic KV cache, one program per length, grew 228 MB a program before, 6 MB after.
"""
from __future__ import annotations

import dataclasses
import math
import os

import torch

from ..frontend.derived_weights import share, shared
from ..frontend.torch_ir import Ref, TorchNode, TorchProgram, TorchType, shape_only
from .weight_chains import merged_chain, readers, weight_chain

MAX_ROWS = 16       # merged only where a step reads the weights for a few rows (decode): at 128
                    # rows (prefill) TinyLlama's MLP ran 1-2% slower merged (Zen 4, 2026-11-29)


def _sibling_key(node: TorchNode, prog: TorchProgram, users: dict, chains: dict, by_name: dict):
    """What a linear must share with its siblings (input, weight dtype and K, bias or not; for a
    weight computed from weights, a QuantLinear's, what it computes: weight_chains.py), or None
    when it is not a linear of an input by a 2-d weight of the program or such a chain."""
    if node.packet != "aten.linear" or node.kwargs or not isinstance(node.args[0], Ref) \
            or math.prod(node.type.shape[:-1]) > MAX_ROWS:
        return None
    weight, bias = node.args[1], node.args[2] if len(node.args) > 2 else None
    types = prog.weight_types
    if bias is not None and (not isinstance(bias, Ref) or bias.name not in types):
        return None
    bias = None if bias is None else types[bias.name].dtype
    if isinstance(weight, Ref) and weight.name not in types:
        chain = weight_chain(prog, weight.name, users, node.name, by_name)
        if chain is None or len(chain.nodes[-1].type.shape) != 2:
            return None
        chains[node.name] = chain
        return node.args[0].name, chain.signature, bias
    if not isinstance(weight, Ref) or len(types[weight.name].shape) != 2:
        return None
    w = types[weight.name]
    return node.args[0].name, w.dtype, w.shape[1], bias


def derive_weights(prog: TorchProgram, changed=None) -> dict[str, torch.Tensor]:
    """The values of the derived weights (those reading a name in `changed`, default all), from
    their sources' current values."""
    out = {}
    for name, sources in prog.derived.items():
        if changed is None or any(s in changed for s in sources):
            values = [prog.weights[s] for s in sources]
            meta = any(map(shape_only, values))
            out[name] = (torch.empty(prog.weight_types[name].shape, dtype=values[0].dtype,
                                     device="meta") if meta else _concatenated(values))
    return out


def _concatenated(values: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(values), one for every program made from these weights (derived_weights.py)."""
    made = shared("cat", values)
    return made if made is not None else share("cat", values, torch.cat(values))


def _merged(prog: TorchProgram, group: list[TorchNode], taken, chains: dict) -> tuple[list[TorchNode], dict]:
    """The merged linear (after its merged weight chain, if any) and one slice per member (named
    as the member), and the new weights (named apart from those in `taken`: one weight may head
    groups of two inputs)."""
    first, n = group[0], len(group)
    derived, types, args, refs_of = {}, {}, [], []
    if first.name in chains:
        members = [chains[node.name] for node in group]
        refs_of += [[c.weights[i] for c in members] for i in range(len(members[0].weights))]
    else:
        refs_of.append([node.args[1].name for node in group])
    if len(first.args) > 2 and first.args[2] is not None:
        refs_of.append([node.args[2].name for node in group])
    for refs in refs_of:
        name = f"{refs[0]}_and_{n - 1}"
        while name in taken or name in types:
            name += "_"
        t = prog.weight_types[refs[0]]
        rows = sum(prog.weight_types[r].shape[0] for r in refs)
        types[name] = TorchType((rows, *t.shape[1:]), t.dtype)
        derived[name] = tuple(refs)
        args.append(Ref(name))
    chain = []
    if first.name in chains:
        chain = merged_chain(members, [a.name for a in args[:len(members[0].weights)]],
                             f"_and_{n - 1}", {m.name for m in prog.nodes})
        args = [Ref(chain[-1].name), *args[len(members[0].weights):]]
    out, width = first.type, sum(node.type.shape[-1] for node in group)
    merged = dataclasses.replace(first, name=f"{first.name}_and_{n - 1}",
                                 args=(first.args[0], *args),
                                 type=TorchType((*out.shape[:-1], width), out.dtype))
    nodes, start = [*chain, merged], 0
    slice_op = torch.ops.aten.slice.Tensor
    for node in group:
        end = start + node.type.shape[-1]
        nodes.append(dataclasses.replace(node, op="aten.slice.Tensor", target=slice_op,
                                         args=(Ref(merged.name), len(out.shape) - 1, start, end),
                                         kwargs={}))
        start = end
    return nodes, {"types": types, "derived": derived, "chain": len(chain)}


def merging() -> bool:
    """False with STRATA_MERGE_PROJECTIONS=0 (to compare): a compile cache keys on it."""
    return os.environ.get("STRATA_MERGE_PROJECTIONS") != "0"


def merge_projections(prog: TorchProgram) -> TorchProgram:
    """`prog` with every group of sibling linears merged (itself when there is none, or with
    STRATA_MERGE_PROJECTIONS=0, to compare)."""
    if not merging():
        return prog
    groups: dict[tuple, list[TorchNode]] = {}
    users, chains, by_name = readers(prog), {}, {n.name: n for n in prog.nodes}
    for node in prog.nodes:
        key = _sibling_key(node, prog, users, chains, by_name)
        group = groups.setdefault(key, []) if key is not None else None
        if group is not None and node.args[1] not in (m.args[1] for m in group):
            group.append(node)          # (a second linear by a weight of the group stays apart)
    groups = {k: g for k, g in groups.items() if len(g) > 1}
    if not groups:
        return prog
    replaced, types, derived = {}, dict(prog.weight_types), dict(prog.derived)
    gone = {c.name for g in groups.values() for m in g if m.name in chains for c in chains[m.name].nodes}
    for group in groups.values():
        nodes, new = _merged(prog, group, types, chains)
        head = new["chain"] + 2                     # the merged chain, linear and first slice
        replaced[group[0].name] = nodes[:head]
        replaced.update({node.name: [s] for node, s in zip(group[1:], nodes[head:])})
        types.update(new["types"])
        derived.update(new["derived"])
    out = dataclasses.replace(prog, nodes=[m for node in prog.nodes if node.name not in gone
                                           for m in replaced.get(node.name, [node])],
                              weight_types=types, derived=derived, weights=dict(prog.weights),
                              notes=[*prog.notes, *(f"merged {len(g)} linears of {k[0]} into one "
                                                    f"({g[0].name}_and_{len(g) - 1})"
                                                    for k, g in groups.items())])
    out.weights.update(derive_weights(out))
    return out
