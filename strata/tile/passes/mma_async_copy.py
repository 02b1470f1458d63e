"""mma_async_copy: fill a tensor-core kernel's shared operand tiles with 16-byte cp.async.

An operand qualifies when it is one plain load of a 16-bit buffer (no prologue to compute) whose
contiguous axis (K, or X for a tile stored along K) has unit stride and a multiple of 8 elements,
every other stride and offset a multiple of 8: then each 16-byte chunk of the tile is one
aligned copy, all in or all out of the matrix, and chunks outside it are zero-filled
(src-size 0). CP_ASYNC=0 keeps plain loads. Declines per operand, saying why.
"""
from __future__ import annotations

from dataclasses import replace

from ...core.context import Context
from ...core.expr import Var, affine_terms
from ...loop.ir import Load
from ..ir import MmaLoop, MmaOperand, TileKernel, flat_index


def why_not(k: TileKernel, op: MmaOperand, k_var: str, k_extent: int) -> str:
    """Why the operand cannot be copied 16 bytes at a time ("" when it can)."""
    if len(op.body) != 1 or not isinstance(op.body[0], Load):
        return "it computes a prologue"
    load = op.body[0]
    if load.pred is not None:
        return "its load is predicated"
    fast, extent = (k_var, k_extent) if op.kmajor else (op.x_var, op.x_extent)
    terms = affine_terms(flat_index(load.index, k.shape_of(load.buf)))
    if terms is None or not all(isinstance(a, Var) for a in terms[0]):
        return "its index is not affine in the loop axes"
    coeffs, const = terms
    if coeffs.get(Var(fast), 0) != 1:
        return f"it is not contiguous along {fast}"
    if extent % 8:
        return f"its contiguous extent {extent} is not a multiple of 8 (16 bytes)"
    bad = [a.name for a, c in coeffs.items() if a != Var(fast) and c % 8]
    if bad or const % 8:
        return f"its stride along {bad[0] if bad else 'the offset'} is not a multiple of 8 elements"
    return ""


def mma_async_copy(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "mma":
        return k
    enabled = ctx.knob("CP_ASYNC", True)
    body = []
    for s in k.body:
        if isinstance(s, MmaLoop):
            ops = []
            for op in (s.a, s.b):
                why = "CP_ASYNC=0 pinned" if not enabled else why_not(k, op, s.k_var, s.extent)
                if why:
                    ctx.log(f"mma_async_copy: {k.name}: {op.side} of {s.acc.acc} keeps plain loads, {why}")
                    ops.append(op)
                else:
                    ops.append(replace(op, fill="cp.async"))
            s = replace(s, a=ops[0], b=ops[1])
        body.append(s)
    return replace(k, body=tuple(body)).with_knob("CP_ASYNC", int(enabled))
