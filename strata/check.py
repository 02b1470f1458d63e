"""Accuracy verdicts: generated kernels against PyTorch eager in float64.

Tolerances follow ../shared/DESIGN.md: relative error ||out - ref|| / ||ref|| below 1e-5 for
float32 elementwise and reductions, 1e-4 when the program contains a contraction, 1e-2 for
fp16/bf16 outputs; integer and bool outputs must match exactly; NaN never passes unless the
reference has NaN in the same place.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from . import dtypes

CONTRACTIONS = ("aten.mm", "aten.bmm", "aten.matmul", "aten.linear", "aten.addmm", "aten.baddbmm",
                "aten.scaled_dot_product_attention", "aten.einsum")


@dataclass
class OutputCheck:
    name: str
    dtype: str
    max_abs: float
    rel: float
    tol: float
    passed: bool


@dataclass
class Report:
    outputs: list[OutputCheck]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


def tolerance(dtype: str, has_contraction: bool) -> float:
    if dtype in ("f16", "bf16"):
        return 1e-2
    if not dtypes.is_float(dtype):
        return 0.0
    return 1e-4 if has_contraction else 1e-5


def _to64(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().double()
    return x


def eager_reference(module, inputs) -> list[np.ndarray]:
    """The eager outputs in float64 (module and floating inputs promoted), flattened."""
    ref_module = copy.deepcopy(module).double() if isinstance(module, torch.nn.Module) else module
    with torch.no_grad():
        out = ref_module(*[_to64(x) for x in inputs])
    flat, _ = torch.utils._pytree.tree_flatten(out)
    return [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in flat]


def compare(name: str, dtype: str, got: np.ndarray, ref: np.ndarray, tol: float) -> OutputCheck:
    got = np.asarray(got)
    ref = np.asarray(ref)
    if got.shape != ref.shape:
        return OutputCheck(name, dtype, float("inf"), float("inf"), tol, False)
    if not dtypes.is_float(dtype):
        bad = got.astype(np.float64) != ref.astype(np.float64)
        err = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()) if got.size else 0.0
        return OutputCheck(name, dtype, err, float(bad.mean()) if got.size else 0.0, tol, not bad.any())
    g, r = got.astype(np.float64), ref.astype(np.float64)
    nan_ok = np.array_equal(np.isnan(g), np.isnan(r))
    inf_ok = np.array_equal(np.isinf(g) & (g > 0), np.isinf(r) & (r > 0)) and \
        np.array_equal(np.isinf(g) & (g < 0), np.isinf(r) & (r < 0))
    finite = np.isfinite(r) & np.isfinite(g)
    diff = np.abs(g[finite] - r[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    denom = float(np.linalg.norm(r[finite]))
    rel = float(np.linalg.norm(diff)) / denom if denom > 0 else max_abs
    return OutputCheck(name, dtype, max_abs, rel, tol, bool(nan_ok and inf_ok and rel <= tol))


def compare_with_eager(program, snippet) -> Report:
    """Run the program's kernels and eager PyTorch on the snippet's inputs; compare outputs.

    On device "cuda" the kernels get device copies of the inputs, outputs and temps are poisoned
    before the run (an element no kernel writes shows as NaN), and the outputs come back to the
    host for the comparison; the reference is always eager on the CPU in float64."""
    inputs = snippet.example_inputs
    if getattr(program, "device", "sim") == "cuda":
        rt = program.runtime
        inputs = [x.to(rt.device) if isinstance(x, torch.Tensor) else x for x in inputs]
        poison, rt.poison = rt.poison, True
        try:
            got = program.run_numpy(inputs)
        finally:
            rt.poison = poison
    else:
        got = program.run_numpy(inputs)
    ref = eager_reference(snippet.module, snippet.example_inputs)
    kp = program.lowered.kernel
    has_mm = any(n.op.startswith(CONTRACTIONS) for n in program.torch_program.nodes)
    checks = []
    for name, g, r in zip(kp.outputs, got, ref):
        dt = kp.buffer(name).dtype
        checks.append(compare(name, dt, g, r, tolerance(dt, has_mm)))
    return Report(checks)


def print_report(program, report: Report, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    console = console or Console(highlight=False)
    on_gpu = getattr(program, "device", "sim") == "cuda"
    if on_gpu:
        rt = program.runtime
        name = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else rt.device
        title = f"kernels launched (CUDA, {name}, {rt.arch})"
        rows = [(r["name"], r["grid"], r["block"], r["smem_bytes"], r["registers"])
                for r in rt.kernel_rows()]
    else:
        title = "kernels launched (simulator)"
        rows = [(k.name, k.grid, k.block, k.smem_bytes) for k in program.kernels]
    table = Table(title=title, title_justify="left")
    cols = ("kernel", "grid", "block", "smem bytes") + (("registers",) if on_gpu else ())
    for col in cols:
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for row in rows:
        table.add_row(*map(str, row))
    console.print(table)
    for o in report.outputs:
        console.print(f"  {o.name} ({o.dtype}): max abs err {o.max_abs:.3g}, rel err {o.rel:.3g} "
                      f"(tolerance {o.tol:g})")
    worst_abs = max((o.max_abs for o in report.outputs), default=0.0)
    worst_rel = max((o.rel for o in report.outputs), default=0.0)
    verdict = "PASS" if report.passed else "FAIL"
    console.print(f"{verdict}  max abs err {worst_abs:.3g}  rel err {worst_rel:.3g}  "
                  f"({len(program.kernels)} kernel{'s' if len(program.kernels) != 1 else ''})")
