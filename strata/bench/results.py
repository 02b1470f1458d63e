"""The measured numbers of a benchmark run, as plain records.

Kept apart from the code that measures them (harness.py, GPU) and the code that renders them
(report.py, pure) so reports can be rebuilt, tested and merged from numbers alone, and every
record round-trips through JSON (`to_dict` / `from_dict`).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

# Variant names, in table order. "torch.compile" is the default mode: the reference of "vs
# torch.compile"; max-autotune is shown beside it.
EAGER = "eager"
TORCH_COMPILE = "torch.compile"
MAX_AUTOTUNE = "torch.compile max-autotune"
STRATA = "strata"
VARIANTS = (EAGER, TORCH_COMPILE, MAX_AUTOTUNE, STRATA)


@dataclass
class Timing:
    """Milliseconds per call over `runs` timed calls (each after an L2 flush)."""
    median_ms: float
    min_ms: float
    p20_ms: float
    p80_ms: float
    runs: int

    @classmethod
    def from_samples(cls, samples_ms) -> Timing:
        xs = sorted(float(x) for x in samples_ms)
        if not xs:
            raise ValueError("no timing samples")
        return cls(statistics.median(xs), xs[0], _quantile(xs, 0.2), _quantile(xs, 0.8), len(xs))


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass
class VariantRow:
    """One way of running the program. status is "ok", "failed: <reason>" or
    "unsupported: <sentence>"; timing is None unless ok."""
    name: str
    status: str = "ok"
    timing: Timing | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.timing is not None

    @property
    def ms(self) -> float | None:
        return self.timing.median_ms if self.ok else None


@dataclass
class KernelRow:
    """One generated kernel: launch shape, resources from the cubin, and its time if measured."""
    name: str
    grid: object = None
    block: object = None
    smem_bytes: int | None = None
    registers: int | None = None
    time_ms: float | None = None


@dataclass
class Ceilings:
    """The device ceilings measured in the same run: a large device-to-device copy (GB/s,
    read + write bytes) and torch.mm at 4096^3 per dtype (TFLOP/s; f32 without TF32)."""
    copy_gbps: float | None = None
    mm_tflops: dict[str, float] = field(default_factory=dict)
    read_gbps: float | None = None     # a large sum's read bandwidth (CPU runs): the memory ceiling
    mm_n: int = 4096                   # the size of the torch.mm measured
    peak_tflops: dict[str, float] = field(default_factory=dict)   # CPU runs: the cached machine
                                       # profile's peak per dtype, the compute ceiling where known


@dataclass
class CaseResult:
    """Everything measured for one program. bytes/flops are the ideal work (inputs, weights and
    outputs moved once; matmul FLOPs), the basis of GB/s, TFLOP/s and % of ceiling.
    accuracy: None (not checked), or the verdict line, starting with PASS or FAIL."""
    name: str
    dtype: str
    bytes: int
    flops: int
    variants: list[VariantRow]
    accuracy: str | None = None
    kernels: list[KernelRow] = field(default_factory=list)
    op: str = ""
    model: str = ""
    seq: int | None = None

    def variant(self, name: str) -> VariantRow | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def accuracy_passed(self) -> bool | None:
        return None if self.accuracy is None else self.accuracy.startswith("PASS")


@dataclass
class Env:
    """Where and when: the device and the versions of everything that shapes the numbers."""
    device: str
    date: str
    torch: str = ""
    cuda: str | None = None
    strata: str = ""
    python: str = ""
    extra: dict[str, str] = field(default_factory=dict)


def to_dict(obj) -> dict:
    return asdict(obj)


def case_from_dict(d: dict) -> CaseResult:
    variants = [VariantRow(v["name"], v.get("status", "ok"),
                           Timing(**v["timing"]) if v.get("timing") else None)
                for v in d.get("variants", [])]
    kernels = [KernelRow(**k) for k in d.get("kernels", [])]
    keep = {k: d[k] for k in ("name", "dtype", "bytes", "flops", "accuracy", "op", "model", "seq")
            if k in d}
    return CaseResult(variants=variants, kernels=kernels, **keep)
