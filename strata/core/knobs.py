"""The one registry of schedule knobs: each knob's meaning, its allowed values and the kernels it
applies to.

Context validates every pinned knob against it (from --knob, STRATA_KNOBS or torch.compile's
options), so a misspelt name or an impossible value is one sentence before any pass runs, and a
pass reading a knob never parses text. The rules are what the passes and the kernel lowering can
generate in general; a value that is valid but cannot fit one kernel (TILE_M=96 on wgmma, CHUNKS
not dividing the reduction) is refused there, or logged at -v as not applying.
`strata compile --knob help` prints `describe_knobs()`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from .errors import KnobError

FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True,
              "0": False, "false": False, "no": False, "off": False}


@dataclass(frozen=True)
class Knob:
    name: str
    meaning: str
    kind: type                         # int, bool or str
    rule: str                          # the allowed values, as the help and the errors say them
    ok: Callable[[object], bool]
    scope: str                         # the kernels that use it: "only <scope> use it"


def _pow2(lo: int, hi: int):
    return int, f"a power of two from {lo} to {hi}", lambda v: lo <= v <= hi and v & (v - 1) == 0


def _between(lo: int, hi: int | None = None):
    if hi is None:
        return int, f"an integer of at least {lo}", lambda v: v >= lo
    return int, f"an integer from {lo} to {hi}", lambda v: lo <= v <= hi


def _one_of(*choices: str):
    return str, ", ".join(choices[:-1]) + " or " + choices[-1], lambda v: v in choices


_FLAG = (bool, "0 or 1 (also false/true, off/on, no/yes)", lambda v: True)
def _tile(hi: int):
    return int, f"a power of two or a multiple of 8, from 1 to {hi}", \
        lambda v: 1 <= v <= hi and (v % 8 == 0 or v & (v - 1) == 0)

CONTRACTION = "contractions"
MMA = "mma.sync contractions (fp16/bf16, sm_80+)"
CUDA_CORE = "CUDA-core contractions"
ATTENTION = "fused attention kernels"
ROWS = "row kernels (reductions, norms, softmax)"

_TABLE = [
    ("INSTR", "the instruction of contractions and attention (wgmma needs sm_90a, mma sm_80+)",
     _one_of("wgmma", "mma", "fma"), "contractions and fused attention kernels"),
    ("TILE_M", "rows of M computed per block", _tile(1024), CONTRACTION),     # a CPU's up to 1024
    ("TILE_N", "columns of N computed per block", _tile(256), CONTRACTION),
    ("TILE_K", "K elements per step of the K loop", _pow2(1, 128), CONTRACTION),
    ("WARPS_M", "warps along M in an mma.sync block", _between(1, 32), MMA),
    ("WARPS_N", "warps along N in an mma.sync block", _between(1, 32), MMA),
    ("WARPGROUPS", "warpgroups (64 rows each) in a wgmma block", _between(1, 4),
     "wgmma contractions (sm_90a)"),
    ("STAGES", "shared-memory buffers of the software-pipelined K loop", _between(1, 8),
     "tensor-core contractions"),
    ("SWIZZLE", "layout of the mma.sync operand tiles in shared memory",
     _one_of("xor", "pad", "none"), MMA),
    ("CP_ASYNC", "fill mma.sync operand tiles with cp.async where alignment allows", _FLAG, MMA),
    ("PROLOGUE", "a computed operand (RMSNorm's x, SiLU(gate) * up) fused or stored once, for "
     "wgmma or the CPU micro-kernel", _one_of("fuse", "materialize"), "contractions with a computed operand"),
    ("SPLIT_K", "blocks sharing the K loop of a contraction (must divide K)", _between(1),
     CONTRACTION),
    ("THREAD_M", "output rows per thread, or per register tile on a CPU (must divide TILE_M; "
     "16 or 32 on AMX tiles)", _between(1, 32), CUDA_CORE + " and CPU contractions"),
    ("FORM", "a CPU contraction as outer products of a packed panel, as dot products along K "
     "(no packing; vdpbf16ps on bf16 with AVX512-BF16), or as outer products of a bf16 panel "
     "holding K in pairs (vdpbf16ps along N), or that panel on AMX tiles (tdpbf16ps; emulated "
     "where the CPU has no AMX)", _one_of("outer", "dot", "pairs", "amx"), "CPU contractions"),
    ("ORDER", "which of a CPU contraction's block loops is outermost: mn (M pieces outer, N "
     "panels fastest: a thread's run of blocks keeps its M-side rows in cache) or nm (M fastest: "
     "each thread an equal share of a short last M piece)", _one_of("mn", "nm"), "CPU contractions"),
    ("PACK", "a CPU contraction's panel of a weight packed by its own kernel, run once when the "
     "program is loaded, or by each block on every call", _one_of("once", "call"), "CPU contractions"),
    ("QDOT", "a quantized matrix-vector row's blocks as int8 dot products (activations quantized "
     "per block, vpdpbusd; vpmaddubsw on AVX2) or as float lanes", _one_of("vnni", "float"),
     "CPU quantized rows"),
    ("QGEMM", "a matrix product by a block-quantized weight on int8 dot products (vpdpbusd; "
     "vpmaddubsw on AVX2) or on its bf16 dequantization", _one_of("int8", "bf16"), "CPU quantized products (M > 1)"),
    ("PREFETCH", "each register tile of a CPU block prefetches part of the next block's packed "
     "panel into L2 under its FMAs (1), or not (0)", _FLAG, "CPU contractions (FORM=outer)"),
    ("K_CHUNK", "K elements a CPU block runs over all its register tiles before the next (the "
     "dot form's N-side rows stay in L1, the outer form's panel rows in L2; 0: all of K at once)",
     _between(0), "CPU contractions (FORM=dot, outer)"),
    ("THREAD_N", "output columns per thread (must divide TILE_N)", _between(1, 16), CUDA_CORE),
    ("PAD_A", "elements of padding per row of the staged M-side tile", _between(0, 32), CUDA_CORE),
    ("PAD_B", "elements of padding per row of the staged N-side tile", _between(0, 32), CUDA_CORE),
    ("BLOCK_M", "queries per attention block", _between(1, 1024), ATTENTION),
    ("BLOCK_N", "keys per step of the attention loop", _between(1, 256), ATTENTION),
    ("ROW_THREADS", "threads sharing a query (CUDA-core attention)", _pow2(1, 32), ATTENTION),
    ("FLASH", "a CPU attention as one flash kernel, its block of scores in cache (1), or as its "
     "matmul and softmax kernels (0)", _FLAG, "CPU attention (softmax(q @ k^T) @ v)"),
    ("KV_SPLITS", "blocks sharing the keys of a query block (decode), combined after",
     _between(1), ATTENTION),
    ("GQA_GROUP", "query heads sharing each K/V tile (must divide the heads per KV head)",
     _between(1), ATTENTION),
    ("CHUNKS", "blocks sharing a long row reduction (must divide it)", _between(1),
     "row kernels that start with a reduction"),
    ("CHUNK_MIN", "the fewest elements per chunk when CHUNKS is chosen", _between(1),
     "row kernels that start with a reduction"),
    ("GROUP", "threads sharing one row", (int, "1 or a multiple of 32 up to 1024",
                                          lambda v: v == 1 or (v % 32 == 0 and 32 <= v <= 1024)),
     ROWS),
    ("BLOCK", "threads per block (a row shared by more than a warp takes the whole block)",
     (int, "a multiple of 32 from 32 to 1024", lambda v: v % 32 == 0 and 32 <= v <= 1024),
     "row and elementwise kernels"),
    ("VEC", "elements per vector load/store (at most 16 bytes; 1 turns vectors off), or a GEMV "
     "row's points per thread and step (8 to 64)", _pow2(1, 64), "row and elementwise kernels"),
    ("SMEM_BUDGET", "bytes of shared memory for staged inputs and matmul tiles",
     _between(0, 48 * 1024), "row kernels reading a row twice and CUDA-core contractions"),
    ("UNROLL_MAX", "the most iterations of a loop given #pragma unroll", _between(0, 64),
     "kernels with loops"),
    ("KEEP", "keep a costly value a CPU row's loop computes (softmax's exp) in a scratch row for a "
     "later loop that computes it again (1), or compute it again (0)", _FLAG, "CPU row kernels"),
    ("BLOCK_LOOPS", "run a CPU loop whose indices divide its variable by a constant (a quantized "
     "weight's blocks) as blocks of that constant (1), or as one loop (0)", _FLAG,
     "CPU row kernels"),
    ("L2_PREFETCH", "KiB of its weights a kernel asks L2 for before it waits for the kernel "
     "before it (0: none; default an eighth of L2)", _between(0), "CUDA kernels reading weights (sm_90+)"),
    ("STORE", "how many of the values a kernel computes again (read at several indices, "
     "broadcast over an axis it does not depend on, or computed by other kernels too; `--ir "
     "loop` lists them, costliest first) are stored once, each by a kernel of its own (0: all "
     "computed inline wherever they are read; default: on a CPU the leading ones holding a "
     "transcendental, small and computed 16+ times a point, on a GPU none)", _between(0, 8),
     "kernels computing a value again"),
    ("THREADS", "OpenMP threads running a CPU kernel's blocks (0: every core when the kernel "
     "has enough work, else one)", _between(0, 256), "CPU kernels"),
]

KNOBS: dict[str, Knob] = {name: Knob(name, meaning, *rule, scope)
                          for name, meaning, rule, scope in _TABLE}


def parse(name: str, value, source: str = "") -> tuple[str, object]:
    """(NAME, typed value) of a pin, or KnobError saying which names or values are allowed.
    `value` may be text or already typed (a Context built from another's knobs)."""
    where = f" (from {source})" if source else ""
    key = str(name).strip().upper()
    knob = KNOBS.get(key)
    if knob is None:
        close = difflib.get_close_matches(key, KNOBS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise KnobError(f"unknown knob {name}{where}; {hint}"
                        f"`strata compile --knob help` lists them")
    text = str(value).strip()
    if knob.kind is bool:
        v = FLAG_WORDS.get(text.lower())
    elif knob.kind is int:
        v = int(text) if text.lstrip("-").isdigit() else None
    else:
        v = text.lower()
    if v is None or not knob.ok(v):
        raise KnobError(f"knob {key}={text}{where} is not allowed: {key} takes {knob.rule}")
    return key, v


def show(value) -> str:
    """A knob value as the kernel header prints it (flags as 0/1)."""
    return str(int(value)) if isinstance(value, bool) else str(value)


def describe_knobs() -> str:
    """The `--knob help` table: every knob, what it sets, its values and where it applies."""
    width = max(map(len, KNOBS))
    lines = ["Schedule knobs (pin with --knob NAME=VALUE or STRATA_KNOBS=NAME=VALUE,...; each "
             "kernel's header shows the values it uses):", ""]
    for k in KNOBS.values():
        lines.append(f"  {k.name:<{width}}  {k.meaning}")
        lines.append(f"  {'':<{width}}  values: {k.rule}; for {k.scope}")
    return "\n".join(lines)
