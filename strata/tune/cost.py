"""The tuner's cost model for the CPU target: a kernel's time estimated from its Kernel IR; and
a GPU roofline from the simulator's counters (`gpu_roofline_us`, shown by `--profile`).

Why analytic: the tuner ranks candidates before measuring them (the best-looking ones are timed
first, so a budget cut short still tries them), and the estimate can be checked against the
measurements it precedes (Spearman rank correlation; how often its top pick is within 1.2x of
the measured best), which `strata tune` prints. A roofline of three terms, per kernel:
  - memory: every buffer the kernel touches, once, at the machine's DRAM bandwidth;
  - cache: every load and store the kernel executes (its re-reads: a GEMM's operand tiles, a
    row read twice), at the per-core cache bandwidth, over the cores that run it;
  - compute: every arithmetic operation (an exp, a tanh ... as ten), at the per-core scalar
    rate, divided by the vector width inside loops the C target vectorises (`#pragma omp
    simd`, kernel_ir/simd_plan.py; a register tile's explicit vectors, codegen/c_outer.py), and by
    two more in its vdpbf16ps loops (codegen/c_dot.py);
plus the cost of waking the OpenMP team when the kernel runs in parallel (the same decision as
codegen/c.py: THREADS, else enough work). DRAM bandwidth is measured once per process (a large
copy with torch); the per-core rates are constants (SCALAR_GOPS, CACHE_GBS), the vector width
is the Target's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..codegen.c import runs_in_parallel
from ..core import dtypes
from ..core.expr import Expr, Op, children
from ..core.scalar_ops import TRANSCENDENTAL
from ..kernel_ir.cpu_ir import VECTOR_ISAS, DotBf16, OuterFma, fits
from ..kernel_ir.ir import For, If, Kernel, Load, LoadVec, Smem, While, walk
from ..kernel_ir.simd_plan import plan_loop
from . import machine as profile
from . import static_cost

SCALAR_GOPS = 2.0           # operations per ns per core (one per cycle at ~2 GHz)
CACHE_GBS = 40.0            # loads and stores per core, bytes per ns
FORK_US = 3.0               # waking the OpenMP team
UNKNOWN_TRIPS = 16          # a loop whose trip count is not a constant
TRANSCENDENTAL_OPS = 10     # an exp, tanh ... counts as this many operations


@dataclass(frozen=True)
class Machine:
    dram_gbs: float                 # bytes per ns across the whole chip
    cores: int
    vector: int                     # fp32 lanes of a vector
    dot_bf16: bool = False          # vdpbf16ps (AVX512-BF16): codegen/c_dot.py's loops
    cache_gbs: float = CACHE_GBS    # loads and stores per core, bytes per ns


_MACHINE: dict = {}


def machine(target) -> Machine:
    """The constants of this machine: the bandwidths of its profile (`strata machine`) where one
    is cached for the host, else DRAM's measured once by a 64 MiB copy."""
    if target.key in _MACHINE:
        return _MACHINE[target.key]
    measured = profile.cached() if target.isa == "native" else None
    if measured and "DRAM read" in measured.ceilings:
        c = measured.ceilings
        _MACHINE[target.key] = Machine(c["DRAM read"], target.cores, max(1, target.vector_bytes // 4),
                                       target.has("avx512_bf16"),
                                       c.get("L2 read", CACHE_GBS * target.cores) / target.cores)
    if target.key not in _MACHINE:
        import torch
        src = torch.ones(16 << 20)             # touched: an untouched page reads as one zero page
        dst = torch.zeros_like(src)
        dst.copy_(src)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - start)
        _MACHINE[target.key] = Machine(2 * src.numel() * 4 / best / 1e9, target.cores,
                                       max(1, target.vector_bytes // 4), target.has("avx512_bf16"))
    return _MACHINE[target.key]


@dataclass
class Counts:
    ops: float = 0.0                # scalar operations
    vector_ops: float = 0.0         # operations in vectorised loops (lanes counted)
    bytes: float = 0.0              # loaded and stored
    flops: float = 0.0              # floating-point operations (an fma as two): a roofline's FLOPs


def _trips(s: For) -> float:
    return UNKNOWN_TRIPS if s.trip_count is None else s.trip_count


def _expr(e: Expr, sizes: dict, c: Counts, vec: bool) -> None:
    if isinstance(e, Load):
        c.bytes += sizes.get(e.buf, 4)
    elif isinstance(e, Op) and e.op not in ("cast",):
        n = TRANSCENDENTAL_OPS if e.op in TRANSCENDENTAL else 1
        if dtypes.is_float(e.dtype):
            c.flops += 2 if e.op == "fma" else 1
        if vec:
            c.vector_ops += n
        else:
            c.ops += n
    for x in children(e):
        _expr(x, sizes, c, vec)


def _count(body, sizes: dict, types: dict, c: Counts, scale: float, vec: bool, dots=(),
           explicit=()) -> None:
    for s in body:
        if isinstance(s, For):
            inner = Counts()
            simd = vec or id(s) in explicit or bool(plan_loop(s, types).pragma(str))
            _count(s.body, sizes, types, inner, 1.0, simd, dots, explicit)
            if id(s) in dots:               # vdpbf16ps: two products and sums per lane
                inner.vector_ops /= 2
            n = _trips(s) * scale
            c.ops += inner.ops * n
            c.vector_ops += inner.vector_ops * n
            c.bytes += inner.bytes * n
            c.flops += inner.flops * n
            continue
        if isinstance(s, While):
            _count(s.body, sizes, types, c, scale * UNKNOWN_TRIPS, vec, dots, explicit)
            continue
        if isinstance(s, If):               # both branches' time, one branch's FLOPs
            branches = Counts(), Counts()
            for part, into in zip((s.then, s.orelse), branches):
                _count(part, sizes, types, into, scale, vec, dots, explicit)
            for into in branches:
                c.ops, c.vector_ops = c.ops + into.ops, c.vector_ops + into.vector_ops
                c.bytes += into.bytes
            c.flops += max(b.flops for b in branches)
        inner = Counts()
        for e in s.exprs():
            _expr(e, sizes, inner, vec)
        width = len(s.vars) if isinstance(s, LoadVec) else 1
        inner.bytes += sum(sizes.get(b, 4) * width for b in s.buffers())   # its own store or load
        c.ops += inner.ops * scale
        c.vector_ops += inner.vector_ops * scale
        c.bytes += inner.bytes * scale
        c.flops += inner.flops * scale


def _sizes_types(k: Kernel) -> tuple[dict, dict]:
    sizes = {p.name: dtypes.ITEMSIZE[p.dtype] for p in k.params}
    sizes.update({s.name: dtypes.ITEMSIZE[s.dtype] for s in walk(k.body) if isinstance(s, Smem)})
    types = {s.var: s.dtype for s in walk(k.body) if hasattr(s, "var") and hasattr(s, "dtype")}
    return sizes, types


def _unique_bytes(k: Kernel) -> int:
    """Every parameter moved once: the memory term's bytes (bench/work.py's ideal, per kernel)."""
    return sum(p.numel * dtypes.ITEMSIZE[p.dtype] for p in k.params)


def kernel_work(k: Kernel) -> tuple[float, int]:
    """(FLOPs, bytes) of one launch of a CPU kernel as the model counts them: every
    floating-point operation its loops execute (an fma as two, an exp as one; a loop whose trip
    count is not a constant as UNKNOWN_TRIPS), and every parameter moved once: a roofline's
    arithmetic intensity (strata view)."""
    c = Counts()
    _count(k.body, *_sizes_types(k), c, 1.0, False)
    return c.flops * k.grid, _unique_bytes(k)


def estimate_ms(k: Kernel, m: Machine, loop: tuple[float, float] | None = None) -> float:
    """The modelled time of one launch of a CPU kernel (block == 1), in milliseconds; `loop`:
    its hot loop's (cycles, FLOPs) per iteration from llvm-mca (static_cost.py), which then
    gives the compute term."""
    sizes, types = _sizes_types(k)
    loops = [s for s in walk(k.body) if isinstance(s, For)]
    dots = {id(s) for s in loops if m.dot_bf16 and isinstance(s, DotBf16)}    # kernel_ir/cpu_ir.py
    explicit = {id(s) for s in loops if isinstance(s, OuterFma)
                and any(lanes == m.vector and fits(s.rows, lanes, r) for lanes, r in VECTOR_ISAS)}
    c = Counts()
    _count(k.body, sizes, types, c, 1.0, False, dots, explicit)
    parallel = runs_in_parallel(k)
    cores = min(k.grid, k.threads or m.cores, m.cores) if parallel else 1
    unique = _unique_bytes(k)
    memory = unique / m.dram_gbs
    cache = c.bytes * k.grid / (m.cache_gbs * cores)
    compute = (c.ops + c.vector_ops / m.vector) * k.grid / (SCALAR_GOPS * cores)
    if loop is not None:
        compute = static_cost.compute_ms(c.flops * k.grid, loop, cores) * 1e6
    return (max(memory, cache, compute) + (FORK_US * 1e3 if parallel else 0.0)) / 1e6


def program_ms(kernels, target, source: str | None = None) -> float:
    """The modelled time of a program's kernels; with their C `source`, each contraction's
    compute term comes from llvm-mca's price of its hot loop on the target's CPU (infinite when
    the compiler takes too long on it)."""
    m = machine(target)
    loops = static_cost.hot_loop_costs(source, target) if source is not None else {}
    if loops is None:
        return float("inf")
    return sum(estimate_ms(k, m, loops.get(k.name)) for k in kernels)


def gpu_roofline_us(prof, target) -> float | None:
    """A GPU kernel's time on `target` from what the simulator counted (kernel_ir/sim_profile.py):
    the slowest of its global bytes (at least each parameter once: cp.async, TMA and ldmatrix
    traffic is not counted) at the DRAM bandwidth, its scalar operations at the CUDA-core rate
    and its tensor-core flops at the tensor rate. No launch cost, no overlap loss: a lower
    bound. None when the Target gives no roofline."""
    if not target.dram_gbs:
        return None
    a = prof.accesses
    moved = max(a["global load"].bytes, prof.minimum_read) + \
        max(a["global store"].bytes, prof.minimum_written)
    return max(moved / target.dram_gbs / 1e3, prof.lane_ops / target.core_tops / 1e6,
               prof.tensor_flops / target.tensor_tflops / 1e6)


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Rank correlation of two equally long lists (None under three points or no spread)."""
    if len(xs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                r[order[t]] = (i + j) / 2
            i = j + 1
        return r
    a, b = ranks(xs), ranks(ys)
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / (va * vb) ** 0.5 if va and vb else None

