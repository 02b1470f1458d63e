"""Twins: tile kernels that are the same but for their names, lowered once.

Why: a model's repeated layers (models/layer_replica.py) give 22 copies of every layer kernel,
alike but for their buffers' and their own names. Lowering and printing an AMX projection's
unrolled micro-kernel takes a fraction of a second; done 22 times over, a TinyLlama prefill of
128 tokens spent 37 s lowering and 30 s emitting C. A twin is found from its Tile IR (small,
before any unrolling) with every name replaced by its position, lowered by renaming the first
one's Kernel IR, verified once, and emitted by the C target as a call of the first one's function.
"""
from __future__ import annotations

import dataclasses
import re

from ..tile.ir import TileKernel
from .ir import Kernel

_RENAMED = ("buf", "src", "dst", "tmap", "bar", "name", "qs", "dest", "x")   # naming a buffer


def tile_key(tk: TileKernel) -> tuple:
    """Equal for kernels that differ only in their own and their buffers' names (in the same
    roles, with the same dtypes, shapes and kinds)."""
    names = [tk.name, *(b.name for b in tk.buffers)]
    index = {n: f"@{i}" for i, n in enumerate(names)}
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(index, key=len, reverse=True)))
                         + r")\b(?!\()")          # (not an op such as tanh(...), named alike)
    text = pattern.sub(lambda m: index[m[0]], str(tk))
    return text, tuple((b.dtype, tuple(b.shape), b.kind) for b in tk.buffers)


def twin(k: Kernel, first: TileKernel, tk: TileKernel) -> Kernel:
    """Kernel k (lowered from `first`) as the kernel of `tk`, first's twin: buffers renamed by
    their positions in the two tile kernels."""
    mapping = {a.name: b.name for a, b in zip(first.buffers, tk.buffers) if a.name != b.name}
    return dataclasses.replace(_rename(k, mapping), name=tk.name, src=tk.src)   # its own lines


def _rename(x, mapping: dict, memo: dict | None = None):
    """x with every buffer-naming field mapped; a node shared by several statements (an index
    expression) is renamed once."""
    memo = {} if memo is None else memo
    key = id(x)
    if key in memo:
        return memo[key]
    if isinstance(x, tuple):      # (leaves are kept inline: most of what a kernel holds)
        out = tuple(v if type(v) in _LEAVES else _rename(v, mapping, memo) for v in x)
    else:
        names = _fields(type(x))
        changes = {}
        for name in names or ():
            v = getattr(x, name)
            new = (mapping.get(v, v) if name in _RENAMED and type(v) is str else v) \
                if type(v) in _LEAVES else _rename(v, mapping, memo)
            if new is not v and new != v:
                changes[name] = new
        out = dataclasses.replace(x, **changes) if changes else x
    memo[key] = out
    return out


_FIELDS: dict = {}
_LEAVES = (str, int, float, bool, type(None))


def _fields(cls) -> tuple | None:
    """The field names of a dataclass (None for any other type), looked up once per class."""
    if cls not in _FIELDS:
        _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls)) \
            if dataclasses.is_dataclass(cls) else None
    return _FIELDS[cls]
