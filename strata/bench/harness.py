"""Timing on a CUDA device, the way docs/design.md "Benchmarks" asks: warm-up, CUDA events around
each call, the L2 cache flushed before every timed call, the median (with min, p20, p80) of many
runs, inputs rotated between copies when they fit in cache; and the device ceilings measured in
the same run (a large device-to-device copy, torch.mm at 4096^3).

Every callable is timed the same way, whatever it is (eager, torch.compile, a strata Program).
The flush runs before the start event, so it is never counted; a call's host overhead is hidden
when the flush takes longer than the call's launches (as in triton's do_bench).
Nothing here runs at import time; the functions need a GPU, `require_cuda` says so in one
sentence otherwise.
"""
from __future__ import annotations

import math

import torch

from ..core import dtypes
from ..core.errors import DeviceUnavailable
from .results import Ceilings, Timing

FALLBACK_FLUSH_BYTES = 256 << 20     # when the L2 size is unknown
MAX_INPUT_COPIES = 4
MM_N = 4096


def require_cuda(what: str = "benchmarking") -> None:
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"{what} needs a CUDA GPU, and torch sees none on this machine "
                                f"(torch {torch.__version__})")


def l2_bytes() -> int | None:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    size = getattr(props, "L2_cache_size", None)
    return int(size) if size else None


def flush_bytes(l2: int | None) -> int:
    """The flush buffer: twice the L2 when known, else 256 MiB."""
    return 2 * l2 if l2 else FALLBACK_FLUSH_BYTES


class L2Flush:
    """Writing a buffer larger than the L2 evicts whatever the previous call left there."""

    def __init__(self, nbytes: int | None = None):
        self.buffer = torch.empty(nbytes or flush_bytes(l2_bytes()), dtype=torch.int8, device="cuda")

    def __call__(self) -> None:
        self.buffer.zero_()


def tensor_bytes(values) -> int:
    flat, _ = torch.utils._pytree.tree_flatten(values)
    return sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))


def input_copies(inputs_bytes: int, l2: int | None, max_copies: int = MAX_INPUT_COPIES) -> int:
    """How many copies of the inputs to rotate: enough to cover twice the L2 when they fit in it."""
    if not l2 or inputs_bytes <= 0 or inputs_bytes > l2:
        return 1
    return max(1, min(max_copies, math.ceil(2 * l2 / inputs_bytes)))


def rotating_arg_sets(inputs: tuple, copies: int) -> list[tuple]:
    """`copies` argument tuples: the originals, then clones (tensors only) of them."""
    sets = [tuple(inputs)]
    for _ in range(copies - 1):
        sets.append(tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs))
    return sets


def time_cuda(fn, arg_sets: list[tuple], flush: L2Flush | None = None, warmup_ms: float = 25.0,
              rep_ms: float = 100.0, min_runs: int = 10, max_runs: int = 500) -> Timing:
    """Time `fn(*args)` with CUDA events, rotating through `arg_sets`, flushing before each call.

    The number of warm-up and timed calls comes from a first estimate, so that warm-up lasts about
    `warmup_ms` and the timed calls about `rep_ms` (at least `min_runs` of them).
    """
    ev = lambda: torch.cuda.Event(enable_timing=True)
    k = len(arg_sets)
    with torch.no_grad():
        fn(*arg_sets[0])
        torch.cuda.synchronize()
        start, end = ev(), ev()
        start.record()
        for i in range(3):
            fn(*arg_sets[i % k])
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / 3, 1e-3)
        for i in range(max(1, min(200, int(warmup_ms / estimate)))):
            fn(*arg_sets[i % k])
        runs = max(min_runs, min(max_runs, int(rep_ms / estimate)))
        starts, ends = [ev() for _ in range(runs)], [ev() for _ in range(runs)]
        for i in range(runs):
            if flush is not None:
                flush()
            starts[i].record()
            fn(*arg_sets[i % k])
            ends[i].record()
        torch.cuda.synchronize()
    return Timing.from_samples([s.elapsed_time(e) for s, e in zip(starts, ends)])


def measure_copy_gbps(nbytes: int | None = None) -> float:
    """Device-to-device copy bandwidth in GB/s, counting read + write bytes."""
    if nbytes is None:
        free, _ = torch.cuda.mem_get_info()
        nbytes = min(1 << 30, free // 8)
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    t = time_cuda(lambda: dst.copy_(src), [()], flush=None, rep_ms=200.0)
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e9


def measure_mm_tflops(dtype: str = "bf16", n: int = MM_N) -> float:
    """torch.mm throughput at n^3 in TFLOP/s (f32 as torch runs it by default: no TF32)."""
    tdt = dtypes.to_torch(dtype)
    a = torch.randn(n, n, device="cuda", dtype=tdt)
    b = torch.randn(n, n, device="cuda", dtype=tdt)
    c = torch.empty(n, n, device="cuda", dtype=tdt)
    t = time_cuda(lambda: torch.mm(a, b, out=c), [()], flush=None, rep_ms=200.0)
    return 2 * n ** 3 / (t.median_ms * 1e-3) / 1e12


def measure_ceilings(mm_dtypes=("bf16",)) -> Ceilings:
    dts = list(dict.fromkeys(["bf16", *mm_dtypes]))
    return Ceilings(copy_gbps=measure_copy_gbps(), mm_tflops={d: measure_mm_tflops(d) for d in dts})
