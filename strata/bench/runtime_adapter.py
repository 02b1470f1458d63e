"""The one place the benchmarks touch strata's CUDA runtime beyond calling a Program.

Expected of a CUDA Program (strata/api/ + strata/runtime/program.py):
  program(*cuda_tensors)                  -> outputs, like the original function
  program.runtime.kernel_rows()           -> [{"name", "grid", "block", "smem_bytes", "registers"}],
                                             one per launch
  program.runtime.time_kernels(inputs)    -> [{"name", ..., "ms"}], one per launch, aligned with
                                             kernel_rows (median of CUDA events around each launch)
Everything here degrades: without `kernel_rows` the Kernel IR gives name/grid/block/smem (no
registers); without `time_kernels` (or when it raises) torch.profiler (CUPTI) times the kernels
by name over whole calls with the L2 flushed before each. Point ROWS_METHOD / TIMES_METHOD
elsewhere if the runtime renames them.
"""
from __future__ import annotations

from statistics import median

from ..core.errors import StrataError
from .results import KernelRow

ROWS_METHOD = "kernel_rows"
TIMES_METHOD = "time_kernels"


def compile_cuda(fn, inputs, ctx=None):
    """strata.compile for the GPU (the inputs are CUDA tensors)."""
    from ..api import compile as strata_compile
    return strata_compile(fn, tuple(inputs), device="cuda", ctx=ctx)


def _get(row, key, default=None):
    if isinstance(row, dict):
        return row.get(key, default)
    return getattr(row, key, default)


def _runtime(program):
    try:
        return getattr(program, "runtime", None)
    except StrataError:      # a Program not compiled for cuda raises rather than returning None
        return None


def kernel_rows(program) -> list[KernelRow]:
    """Name, grid, block, shared memory and registers of every kernel launch of the program."""
    method = getattr(_runtime(program), ROWS_METHOD, None)
    if callable(method):
        return [KernelRow(name=str(_get(r, "name")), grid=_get(r, "grid"), block=_get(r, "block"),
                          smem_bytes=_get(r, "smem_bytes"), registers=_get(r, "registers"))
                for r in method()]
    lowered = getattr(getattr(program, "lowered", None), "kernel", None)
    once = set(getattr(lowered, "once", ()) or ())       # packed weights: not part of a call
    return [KernelRow(name=k.name + (" (once, at load)" if k.name in once else ""),
                      grid=getattr(k, "grid", None), block=getattr(k, "block", None),
                      smem_bytes=getattr(k, "smem_bytes", None))
            for k in (getattr(program, "kernels", None) or [])]


def _ms(x) -> float | None:
    if isinstance(x, dict):
        x = x.get("ms", x.get("time_ms"))
    return None if x is None else float(x)


def normalize_times(got, names: list[str]) -> list[float | None]:
    """Milliseconds aligned with the kernel rows, from {name: ms}, or a per-launch sequence of
    numbers or {"name", "ms"} dicts (matched by position when the lengths agree, else by name)."""
    if got is None:
        return [None] * len(names)
    if isinstance(got, dict):
        return [_ms(got.get(n)) for n in names]
    got = list(got)
    if len(got) == len(names):
        return [_ms(x) for x in got]
    by_name = {_get(x, "name"): _ms(x) for x in got if isinstance(x, dict)}
    return [by_name.get(n) for n in names]


def kernel_times(program, inputs, flush=None, runs: int = 20) -> list[float | None]:
    """Median milliseconds of each kernel launch, aligned with kernel_rows(program)."""
    names = [k.name for k in kernel_rows(program)]
    method = getattr(_runtime(program), TIMES_METHOD, None)
    if callable(method):
        try:
            return normalize_times(method(list(inputs)), names)
        except Exception:  # noqa: BLE001, S110 - the profiler below is the fallback
            pass
    by_name = profiler_kernel_times(program, inputs, set(names), flush, runs)
    return [by_name.get(n) for n in names]


def profiler_kernel_times(fn, inputs, names: set[str], flush=None, runs: int = 20) -> dict[str, float]:
    """Kernel durations from torch.profiler (CUPTI sees driver-API launches too)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        fn(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                if flush is not None:
                    flush()
                fn(*inputs)
            torch.cuda.synchronize()
    samples: dict[str, list[float]] = {}
    for e in prof.events():
        if e.name in names and str(getattr(e, "device_type", "")).endswith("CUDA"):
            samples.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e3)
    return {name: (median(xs) if len(xs) == runs else sum(xs) / runs) for name, xs in samples.items()}


def with_times(rows: list[KernelRow], times: list[float | None]) -> list[KernelRow]:
    for r, ms in zip(rows, times):
        r.time_ms = ms
    return rows
