"""Kernel IR -> source: one emitter module per language of the C family (cfamily.py is their
shared walk) and the registry every caller picks one from. A compiled program's language is its
Target's `language` (CUDA C for a GPU, C for a CPU by default); hand-written kernels
(@strata.kernel) print in any of the five. Adding a language is a module here and a line in
LANGUAGES."""
from ..core.errors import StrataError
from . import c, cuda, hip, metal, opencl
from .cfamily import cname, distinct_kernels
from .cuda_units import Units, plan_units

LANGUAGES = {"cuda": cuda, "c": c, "opencl": opencl, "hip": hip, "metal": metal}


def emit_units(program, target) -> Units:
    """A compiled program's source in its target's language, as the translation units its
    compiler takes: CUDA's a few kernels each (cuda_units.py), the others' one."""
    if target.language == "cuda":
        return plan_units(program, target)
    names = [cname(k.name) for k in distinct_kernels(program)]
    return Units([LANGUAGES[target.language].emit_program(program, target)], [names],
                 {n: n for n in names})


def emit_source(kernels: list, language: str) -> str:
    """Hand-written kernels (any block size) as one translation unit in `language`."""
    if language not in LANGUAGES:
        raise StrataError(f"target {language!r}: a kernel's source is "
                          f"{', '.join(repr(n) for n in LANGUAGES)}")
    return LANGUAGES[language].emit_source(kernels)
