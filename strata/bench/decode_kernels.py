"""How close each weight-reading kernel of a decode step comes to the memory limit on the GPU.

Why: a decode step at batch 1 is bound by reading its weights once, so the number to watch per
kernel is the weight bytes it reads over its time, against the device-to-device copy bandwidth
the same run measured (issue 53: every decode-step GEMV >= 80% of it). Kernel times are CUDA
events around each plain launch (CudaProgram.time_kernels), so they include no host cost; on the
CPU, each kernel's call timed in launch order (NativeProgram.time_kernels), against the read rate
of a large sum."""
from __future__ import annotations

from ..core import dtypes
from ..core.expr import children, free_vars
from ..kernel_ir.ir import Load, walk


def weight_bandwidth(program, inputs, copy_gbps: float | None, top: int = 8,
                     ceiling: str = "the copy bandwidth") -> list[str]:
    """Report lines: where the step's kernel time goes (`breakdown`), then the `top` slowest
    kernels that read weights, with their GB/s."""
    kp = program.lowered.kernel
    weights = {b.name for b in kp.buffers if b.kind == "weight"}
    ids = {b.name for b in kp.buffers if b.kind == "input" and b.dtype in INTEGER}
    rows, timings = [], program.runtime.time_kernels(inputs)
    for kernel, timing in zip(kp.kernels, timings):
        looked_up = gathered(kernel, ids)
        nbytes = sum(p.numel * dtypes.ITEMSIZE[p.dtype] for p in kernel.params
                     if p.name in weights and p.name not in looked_up)
        if nbytes and timing["ms"] > 0:
            rows.append((timing["ms"], kernel.name, nbytes, nbytes / timing["ms"] / 1e6))
    if not rows:
        return []
    total_ms, total_bytes = sum(r[0] for r in rows), sum(r[2] for r in rows)
    share = (lambda gbps: f", {gbps / copy_gbps:.0%} of {ceiling}") if copy_gbps else \
        (lambda gbps: "")
    lines = [breakdown(kp, timings),
             f"decode step, {len(rows)} weight-reading kernels: {total_bytes / 1e6:,.1f} MB in "
             f"{total_ms:.3f} ms of kernel time, {total_bytes / total_ms / 1e6:,.0f} GB/s"
             f"{share(total_bytes / total_ms / 1e6)}"]
    for ms, name, nbytes, gbps in sorted(rows, reverse=True)[:top]:
        lines.append(f"  {name}: {ms * 1e3:.1f} µs, {nbytes / 1e6:.2f} MB of weights, "
                     f"{gbps:,.0f} GB/s{share(gbps)}")
    return lines


INTEGER = ("i32", "i64")


def gathered(kernel, ids: set) -> set:
    """The buffers a kernel reads at an index made from a value it loaded from `ids` (a token's
    row of the embedding table): a few bytes, not the whole table (counted whole, a TinyLlama
    step's four lookups read 524 MB)."""
    looked, out = set(), set()
    for s in walk(kernel.body):
        for e in s.exprs():
            for load in _loads(e):
                if load.buf in ids:
                    looked.add(getattr(s, "var", None))
                elif free_vars(load.index) & looked:
                    out.add(load.buf)
    return out


def _loads(e):
    if isinstance(e, Load):
        yield e
    for c in children(e):
        yield from _loads(c)


ROLES = ("weight-reading", "split-K sums", "attention", "cache and input writes", "other")


def role(kernel, weights: set, inputs: set) -> str:
    """What a step's kernel does, from the buffers it touches."""
    names = {p.name for p in kernel.params}
    if names & weights:
        return ROLES[0]
    if any(n.endswith("_partial") for n in names):
        return ROLES[1]
    if "attention" in kernel.name:
        return ROLES[2]
    if any(p.output and p.name in inputs for p in kernel.params):
        return ROLES[3]
    return ROLES[4]


def breakdown(kp, timings) -> str:
    """All the step's kernels timed one by one, summed by role: with the measured ms a token,
    how much of a token is kernels (each timed alone: its launch gap included) and whose."""
    kinds = {kind: {b.name for b in kp.buffers if b.kind == kind} for kind in ("weight", "input")}
    count, ms = dict.fromkeys(ROLES, 0), dict.fromkeys(ROLES, 0.0)
    for kernel, timing in zip(kp.kernels, timings):
        r = role(kernel, kinds["weight"], kinds["input"])
        count[r], ms[r] = count[r] + 1, ms[r] + timing["ms"]
    parts = ", ".join(f"{r} {count[r]} in {ms[r]:.3f}" for r in ROLES if count[r])
    return (f"decode step, all {len(timings)} kernels one by one: {sum(ms.values()):.3f} ms "
            f"({parts})")
