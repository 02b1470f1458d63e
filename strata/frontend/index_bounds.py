"""Which program inputs are read as row numbers of a table, and how many rows it has.

Why: a native kernel reads `table[id]` as it is, so a token id past the vocabulary (a wrong
tokenizer, garbage in a padded batch) read memory outside the table and the process died of a
segmentation fault, where eager raises an IndexError. Indices a program computes itself (argmax,
topk, arange) are in range by construction; those a caller passes are checked before a native
call (runtime/native.py) against the tables they index here: an input reaching an embedding's
or an index_select's indices through views and integer casts only.
"""
from __future__ import annotations

from .torch_ir import Ref, TorchProgram

# op -> (position of the table, position of the indices, position of the axis or its value)
GATHERS = {"aten.embedding": (0, 1, 0), "aten.index_select": (0, 2, 1)}
SAME_VALUES = {"aten.view", "aten._unsafe_view", "aten.reshape", "aten.unsqueeze", "aten.squeeze",
               "aten.expand", "aten.clone", "aten.contiguous", "aten.flatten", "aten.permute",
               "aten.t", "aten.to", "aten._to_copy", "aten.alias", "aten.detach"}


def index_bounds(tp: TorchProgram) -> dict[int, tuple[int, str]]:
    """{input position: (rows, what reads it)}: the inputs read as row numbers, the fewest rows
    of any table each indexes."""
    inputs = list(tp.inputs)
    source = {name: name for name in inputs}            # node -> the input its values are
    types = {**tp.inputs, **tp.weight_types}
    out: dict[int, tuple[int, str]] = {}
    for n in tp.nodes:
        types[n.name] = n.type
        first = n.args[0] if n.args else None
        if n.packet in SAME_VALUES and isinstance(first, Ref) and first.name in source:
            source[n.name] = source[first.name]
        table, ids, axis = GATHERS.get(n.packet, (0, len(n.args), 0))
        if ids >= len(n.args) or not isinstance(n.args[ids], Ref) or n.args[ids].name not in source:
            continue
        shape = getattr(types.get(getattr(n.args[table], "name", None)), "shape", None)
        if not shape:
            continue
        rows = shape[(axis if n.packet == "aten.embedding" else n.args[axis]) % len(shape)]
        pos = inputs.index(source[n.args[ids].name])
        if pos not in out or rows < out[pos][0]:
            out[pos] = (rows, n.packet.removeprefix("aten.") + (f" at {n.where}" if n.where else ""))
    return out
