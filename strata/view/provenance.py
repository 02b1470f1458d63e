"""Which Torch IR op became which kernels, and which lines of every stage they are.

Why computed here: the stages keep provenance only as text (`Kernel.src`, "aten.linear @
<snippet>:1", one op per kernel), but a fused kernel computes several ops. The Tensor IR nodes
carry their op's `src` and are named after it (`rms_norm_sq` from `rms_norm`); a Loop IR kernel
computes every node between what it writes and what it reads; a Tile IR / Kernel IR kernel came
from a Loop IR kernel (`TileProgram.origin`). Line ranges are found in each stage's printed text
by its kernel headers, so the page highlights exactly what `--ir STAGE` prints."""
from __future__ import annotations

import re

from .passes import blocks

ASSIGN = re.compile(r"^(\w+) = ")


def tensor_owner(torch_nodes, tensor_nodes) -> dict[str, str]:
    """{Tensor IR node: the Torch IR node it was decomposed from}: the node of that name, else
    the one with the same src whose name is the longest prefix of it, else the first with that
    src (a cast named after its operand)."""
    names = {n.name for n in torch_nodes}
    by_src: dict[str, list[str]] = {}
    for n in torch_nodes:
        src = f"{n.packet} @ {n.where.loc}" if n.where else n.packet
        by_src.setdefault(src, []).append(n.name)
    out = {}
    for t in tensor_nodes:
        if t.name in names:
            out[t.name] = t.name
            continue
        same = by_src.get(t.src, [])
        prefixed = [n for n in same if t.name.startswith(n + "_")]
        if prefixed or same:
            out[t.name] = max(prefixed, key=len) if prefixed else same[0]
    return out


def loop_kernel_nodes(kernel, tensor_program) -> list[str]:
    """The Tensor IR nodes a Loop IR kernel computes: from its writes back to its reads."""
    by = tensor_program.by_name
    stop, seen, todo = set(kernel.reads), [], list(kernel.writes)
    while todo:
        name = todo.pop()
        if name in seen or name not in by:
            continue
        seen.append(name)
        todo += [o for o in by[name].operands() if o not in stop]
    return seen


def line_owners(text: str, owner_of_header) -> dict[str, list[int]]:
    """{owner: the line numbers (0-based) of its kernels} in a Loop / Tile / Kernel IR text."""
    out: dict[str, list[int]] = {}
    for name, start, body in blocks(text.splitlines()):
        out.setdefault(owner_of_header(name), []).extend(range(start, start + len(body)))
    return out


def source_ranges(text: str, kernel_names: list[str]) -> dict[str, list[int]]:
    """{kernel: its lines} in emitted CUDA or C: the function and the comments above it."""
    lines = text.splitlines()
    out = {}
    for name in kernel_names:
        pat = re.compile(rf"^(?:[^\s/].*\s)?{re.escape(name)}\(")
        start = next((i for i, line in enumerate(lines) if pat.match(line)), None)
        if start is None:
            continue
        end = next((j for j in range(start, len(lines)) if lines[j] == "}"), len(lines) - 1)
        while start > 0 and lines[start - 1] and not lines[start - 1].startswith(("}", "#")) \
                and not lines[start - 1].startswith(" "):
            start -= 1
        out[name] = list(range(start, end + 1))
    return out


def assignments(text: str) -> dict[str, int]:
    """{name: line} of each `name = ...` line (Torch IR and Tensor IR)."""
    out = {}
    for i, line in enumerate(text.splitlines()):
        m = ASSIGN.match(line)
        if m:
            out.setdefault(m[1], i)
    return out
