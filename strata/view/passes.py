"""Each kernel's pass history, rebuilt from the -vv log of `run_tile_passes`.

The log holds, per tile pass, its time (`t:007_mma_tile  0.04 ms`), what it declined or chose
(`split_matmul_k: k_linear_reduce: K=2048 split 4 ways`) and, when it changed the program, a
unified diff of the whole program between `>>> t:NNN_name` and `<<< t:NNN_name`. Applying those
diffs in order to the Loop IR text gives the program after every pass; cutting each into its
kernels (grouped by the Loop IR kernel they came from, as a pass may split one) gives a diff per
kernel per pass. Why not a hook in the pipeline: the log already carries it all, and a page
built from the log cannot disagree with what `-vv` prints."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

TIMING = re.compile(r"^t:(\d{3})_(\w+)\s+([\d.]+) ms$")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
HEADER = re.compile(r"^(?:=== (\S+) -> .* ===|kernel (\w+))")
NOTE = re.compile(r"^(\w+): (\w+): (.*)$", re.S)


@dataclass
class PassStep:
    num: int
    name: str
    ms: float
    diff: str = ""                      # the whole program's diff, as -vv prints it
    notes: list = field(default_factory=list)    # (kernel, text) the pass logged


@dataclass
class KernelStep:
    num: int                            # the pass's position (1 first)
    changed: bool
    diff: str                           # this kernel family's diff ("" when unchanged)
    notes: list                         # what the pass said about it


def parse_log(messages: list[str], pass_names: list[str]) -> list[PassStep]:
    """The tile passes in order, with their time, diff and notes, from a recorded log."""
    steps, pending = [], []
    known = set(pass_names)
    for msg in messages:
        m = TIMING.match(msg)
        if m:
            steps.append(PassStep(int(m[1]), m[2], float(m[3]),
                                  notes=[(k, t) for p, k, t in pending if p == m[2]]))
            pending = [x for x in pending if x[0] != m[2]]
        elif msg.startswith(">>> t:") and steps:
            steps[-1].diff = "\n".join(msg.splitlines()[1:-1])
        else:
            n = NOTE.match(msg)
            if n and n[1] in known:
                pending.append((n[1], n[2], n[3]))
    return steps


def apply_diff(text: list[str], diff: str) -> list[str]:
    """`text` (lines) with a unified diff (hunks only, as the -vv log has them) applied."""
    out, pos = [], 0
    for line in diff.splitlines():
        m = HUNK.match(line)
        if m:
            start = int(m[1]) - (0 if m[2] == "0" else 1)
            out += text[pos:start]
            pos = start
        elif line.startswith(("-", " ")) or line == "":
            if not line.startswith("-"):
                out.append(line[1:])
            pos += 1
        elif line.startswith("+"):
            out.append(line[1:])
    return out + text[pos:]


def blocks(text: list[str]) -> list[tuple[str, int, list[str]]]:
    """(kernel name, first line, its lines) for each kernel of a Loop / Tile / Kernel IR text."""
    out = []
    for i, line in enumerate(text):
        m = HEADER.match(line)
        if m:
            out.append((m[1] or m[2], i, []))
        if out:
            out[-1][2].append(line)
    return [(name, i, lines[:-1] if lines and not lines[-1] else lines) for name, i, lines in out]


def family_of(name: str, origin: dict, loop_names: list[str]) -> str:
    """The Loop IR kernel a (possibly intermediate, split) Tile IR kernel came from."""
    if name in origin:
        return origin[name]
    if name in loop_names:
        return name
    prefixes = [n for n in loop_names if name.startswith(n)]
    return max(prefixes, key=len) if prefixes else name


def kernel_histories(loop_text: str, tile_text: str, steps: list[PassStep], origin: dict,
                     loop_names: list[str]) -> tuple[dict[str, list[KernelStep]], bool]:
    """({loop kernel: a KernelStep per pass}, whether replaying the diffs reproduced the final
    Tile IR exactly: when it does not, the page says so and keeps the whole-program diffs)."""
    text = loop_text.splitlines()

    def grouped(lines):
        out: dict[str, list[str]] = {}
        for name, _, body in blocks(lines):
            out.setdefault(family_of(name, origin, loop_names), []).extend(body + [""])
        return {k: v[:-1] for k, v in out.items()}

    before = grouped(text)
    hist: dict[str, list[KernelStep]] = {name: [] for name in loop_names}
    for step in steps:
        if step.diff:
            text = apply_diff(text, step.diff)
        after = grouped(text) if step.diff else before
        for fam in hist:
            a, b = before.get(fam, []), after.get(fam, [])
            diff = "" if a == b else "\n".join(
                list(difflib.unified_diff(a, b, lineterm="", n=2))[2:])
            notes = [t for k, t in step.notes if family_of(k, origin, loop_names) == fam]
            hist[fam].append(KernelStep(step.num, a != b, diff, notes))
        before = after
    return hist, "\n".join(text) == tile_text
