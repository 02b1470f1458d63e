"""When a flat index allows a vector access: shared by vectorize (loads and stores of a row)
and stage_inputs (the staging copy), so that neither pass imports the other."""
from __future__ import annotations

from ..core.expr import Var, affine_terms


def aligned(flat, inner: str, vec: int, fixed: set[str]) -> bool:
    """Is flat = inner + (multiples of vec in the `fixed` variables) + a multiple of vec?"""
    lin = affine_terms(flat)
    if lin is None:
        return False
    terms, const = lin
    for atom, coeff in terms.items():
        if atom == Var(inner):
            continue
        if not (isinstance(atom, Var) and atom.name in fixed) or coeff % vec:
            return False
    return const % vec == 0
