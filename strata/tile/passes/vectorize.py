"""vectorize: give each thread VEC consecutive elements so loads and stores move 16 bytes.

Applies to elementwise kernels whose innermost axis is a multiple of VEC and whose every access
either does not move with that axis (a broadcast, loaded once) or moves with unit stride from
an aligned base. Declines, saying which access prevents it, otherwise.
"""
from __future__ import annotations

from dataclasses import replace

from ... import dtypes
from ...context import Context
from ...expr import Var, affine_terms, coefficient, free_vars
from ...loop.ir import Load, Store
from ..ir import TileKernel, flat_index, walk


def _aligned(flat, inner: str, vec: int, domain_vars: set[str]) -> bool:
    lin = affine_terms(flat)
    if lin is None:
        return False
    terms, const = lin
    for atom, coeff in terms.items():
        if atom == Var(inner):
            continue
        if not (isinstance(atom, Var) and atom.name in domain_vars) or coeff % vec:
            return False
    return const % vec == 0


def vectorize(k: TileKernel, ctx: Context) -> TileKernel:
    if k.mode != "elementwise" or not k.domain:
        return k
    inner, extent = k.domain[-1]
    accesses = [s for s in walk(k.body) if isinstance(s, (Load, Store))]
    widest = max((dtypes.ITEMSIZE[k.dtype_of(s.buf)] for s in accesses), default=4)
    vec = ctx.knob("VEC", max(1, 16 // widest))
    if vec == 1:
        return k.with_knob("VEC", 1)
    domain_vars = {v for v, _ in k.domain}
    why = None
    if extent % vec:
        why = f"innermost extent {extent} is not a multiple of {vec}"
    for s in accesses:
        if why:
            break
        flat = flat_index(s.index, k.shape_of(s.buf))
        c = coefficient(flat, inner)
        if isinstance(s, Load) and s.pred is not None:
            why = f"{s.buf} is read under a predicate"
        elif not free_vars(flat) <= domain_vars:
            why = f"{s.buf} is read at a data-dependent index"
        elif c == 0 and isinstance(s, Load):
            continue
        elif c != 1 or not _aligned(flat, inner, vec, domain_vars):
            why = f"{s.buf} is not accessed contiguously from an aligned base"
    if why:
        ctx.log(f"vectorize: {k.name}: declined, {why}")
        return k.with_knob("VEC", 1)
    return replace(k, vec=vec).with_knob("VEC", vec)
