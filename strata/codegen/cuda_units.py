"""A program's CUDA as a few translation units, each kernel body written once: the text `--ir
cuda` prints and the runtime's NVRTC compiles unit by unit, on threads (runtime/cuda_units.py).

Why: a whole model is about 500 kernels; as one 5 MB source NVRTC took 40 s per SmolLM2-135M
program (one core, 2026-11-26). Most kernels are twins of an earlier one (the layers repeat:
kernel_ir/twins.py), which launch that one's function with their own arguments (the ABI passes
them by position); the rest go UNIT_KERNELS to a unit, whatever the core count, so a program
makes the same units, and hits the same cubin cache entries (runtime/cache.py), on every machine.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..kernel_ir.ir import KernelProgram
from .cfamily import cname, distinct_kernels, numbered
from .cuda import emit_kernel, emit_program

UNIT_KERNELS = 16


@dataclass(frozen=True)
class Units:
    sources: list[str]            # one translation unit each
    kernels: list[list[str]]      # the C names of the kernels each unit defines
    function_of: dict[str, str]   # every kernel's C name -> the kernel compiled for it

    def text(self) -> str:
        """The units one after the other (each begins with its `// strata:` line)."""
        return "".join(self.sources) or "// strata: no kernels (every output is empty or an input)\n"


def plan_units(program: KernelProgram, arch) -> Units:
    """Each kernel's function (its own, or its twin's: the lowering's `program.twins`, else the
    same code by cfamily's `numbered`), and the kernels written, split into units; each unit is
    emit_program's source for its kernels, for `arch` (a Target or its name)."""
    first: dict[tuple, str] = {}
    function_of: dict[str, str] = {}
    written = []
    for k in distinct_kernels(program):
        name = cname(k.name)
        twin = program.twins.get(k.name)
        if twin is not None and cname(twin) in function_of:
            function_of[name] = function_of[cname(twin)]
            continue
        function_of[name] = first.setdefault((numbered(emit_kernel(k), k), k.dynamic_smem_bytes),
                                             name)
        if function_of[name] == name:
            written.append(k)
    chunks = [written[i:i + UNIT_KERNELS] for i in range(0, len(written), UNIT_KERNELS)]
    names = [[cname(k.name) for k in c] for c in chunks]
    return Units([emit_program(replace(program, kernels=c), arch) + "".join(
        f"// {k} launches {f} (its twin: the same code on its own buffers)\n"
        for k, f in function_of.items() if k != f and f in unit) for c, unit in zip(chunks, names)],
        names, function_of)
