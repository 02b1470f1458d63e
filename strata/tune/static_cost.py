"""A contraction's compute time from its machine code: llvm-mca's cycles for the hot loop.

Why: the tuner's analytic model (cost.py) counts operations, so it cannot tell two register
tiles or two packings apart, and on a CPU strata is not running on nothing can be timed. The
machine code can be read on any machine: the program's C is compiled for the target's -march
(runtime/disasm.py), each kernel's hot loop found (runtime/mca.py), and its FLOPs per iteration
counted from the instructions (a ymm FMA: 8 lanes x 2; vdpbf16ps: two products a lane; an AMX
tdpbf16ps: 16 x 16 x 32 products). The kernel's FLOPs over that give the loop's iterations,
and llvm-mca's cycles per iteration for the target's CPU (at CLOCK_GHZ) their time, on the
cores the kernel's blocks run on. Kernels whose hot loop does no FMAs (rows, elementwise) keep
the analytic compute term.
"""
from __future__ import annotations

import re
import subprocess

from ..core.errors import StrataError
from ..runtime.disasm import disassemble_functions
from ..runtime.mca import cycles_per_iteration, hot_loop

COMPILE_S = 60              # a schedule gcc takes minutes over ranks last (FORM=dot of strided
                            # f32 weights took 200 s before cpu_form refused it)
CLOCK_GHZ = 2.0             # cycles per ns: cost.py's SCALAR_GOPS assumes one op a cycle at this
_LANES = {"zmm": 16, "ymm": 8, "xmm": 4}        # fp32 lanes of an x86 register
# FLOPs of one instruction per fp32 lane: an FMA 2, a bf16 pair dot 4, an int8 quad dot 8
_X86 = re.compile(r"^(vfn?m(?:add|sub)\w*ps|vdpbf16ps|vpdpbusds?)\s+.*%([xyz]mm)\d+$")
_PER_LANE = {"vdpbf16ps": 4, "vpdpbusd": 8, "vpdpbusds": 8}
_TILE = {"tdpbf16ps": 16 * 16 * 32 * 2, "tdpbssd": 16 * 16 * 64 * 2, "tdpbsud": 16 * 16 * 64 * 2,
         "tdpbusd": 16 * 16 * 64 * 2, "tdpbuud": 16 * 16 * 64 * 2}
_ARM = re.compile(r"^(fmla|bfdot|sdot|udot)\s+v\d+\.(\d+)([sh])")   # NEON: lanes in the name
_ARM_PER_LANE = {"fmla": 2, "bfdot": 4, "sdot": 8, "udot": 8}


def flops_per_iteration(body: list[str]) -> float:
    """The floating-point (or int8 dot) operations one pass of `body` does in its FMA-like
    instructions; 0 where it has none this module can count (SVE, RISC-V vectors)."""
    total = 0.0
    for line in body:
        op = line.split()[0] if line.split() else ""
        if op in _TILE:
            total += _TILE[op]
        elif m := _X86.match(line):
            total += _LANES[m[2]] * _PER_LANE.get(m[1], 2)
        elif m := _ARM.match(line):
            total += int(m[2]) * _ARM_PER_LANE[m[1]]
    return total


def hot_loop_costs(source: str, target) -> dict[str, tuple[float, float]] | None:
    """(cycles per iteration, FLOPs per iteration) of the hot loop of each kernel whose hot loop
    does FMAs, on `target`'s CPU; None when the compiler takes over COMPILE_S on the source (a
    schedule it would hang the tuner on). StrataError when llvm-mca cannot price a hot loop
    with FMAs (missing, or its CPU model lacks an instruction)."""
    out: dict[str, tuple[float, float]] = {}
    try:
        functions = disassemble_functions(source, target, COMPILE_S)
    except subprocess.TimeoutExpired:
        return None
    for name, asm in functions.items():
        kernel = name.split(".")[0]
        if not kernel.startswith("k_"):
            continue
        body = hot_loop(asm)
        flops = flops_per_iteration(body)
        if not flops:
            continue                # (the count model's compute term stays)
        cycles, why = cycles_per_iteration(body, target)
        if cycles is None:          # a price from the other model would not compare with these
            raise StrataError(f"{kernel}'s hot loop has no price on {target.name}: {why}")
        if kernel not in out or flops > out[kernel][1]:     # (an OpenMP body: the busiest)
            out[kernel] = (cycles, flops)
    return out


def compute_ms(flops: float, loop: tuple[float, float], cores: int) -> float:
    """The time of `flops` done by a hot loop of (cycles, FLOPs) per iteration on `cores`."""
    cycles, per_iteration = loop
    return flops / per_iteration * cycles / CLOCK_GHZ / max(1, cores) / 1e6
