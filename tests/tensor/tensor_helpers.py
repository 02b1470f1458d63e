"""Shared checks for Tensor IR tests: capture a function, lower it, verify it, evaluate it with
NumPy and compare with torch eager (relative error in float64; NaN never passes)."""
import numpy as np
import torch

from strata.core import dtypes
from strata.frontend.capture import capture
from strata.tensor.decompose import to_tensor_ir
from strata.tensor.eval import evaluate
from strata.kernel_ir.verify import verify_program


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def compare(name: str, got: np.ndarray, ref: torch.Tensor, tol: float) -> None:
    want = to_numpy(ref)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    if not ref.dtype.is_floating_point:
        assert np.array_equal(got.astype(want.dtype), want), f"{name}: {got} != {want}"
        return
    if ref.dtype in (torch.float16, torch.bfloat16):
        tol = max(tol, 1e-2)
    got, want = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{name}: NaN where torch has none"
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin], want[~fin], equal_nan=True), f"{name}: inf mismatch"
    assert np.isfinite(got[fin]).all(), f"{name}: non-finite where torch is finite"
    diff = np.linalg.norm(got[fin] - want[fin])
    scale = np.linalg.norm(want[fin])
    err = diff / scale if scale > 0 else diff
    assert err < tol, f"{name}: relative error {err:.3g} >= {tol:g}"


def check(fn, *inputs, tol=1e-5, precisions=("f64",), names=None):
    """Lower fn(*inputs) to Tensor IR and compare every output with torch eager."""
    prog = capture(fn, inputs, input_names=names)
    tprog = to_tensor_ir(prog)
    tprog.verify()
    with torch.no_grad():
        ref = fn(*inputs)
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    assert len(refs) == len(tprog.outputs)
    feed = {n: to_numpy(x) for n, x in zip(prog.input_names, inputs)}
    for precision in precisions:
        outs = evaluate(tprog, feed, precision)
        for o, r in zip(tprog.outputs, refs):
            assert tprog.node(o).type.dtype == dtypes.from_torch(r.dtype), f"{o}: dtype"
            compare(f"{o} ({precision})", outs[o], r, tol)
    return tprog


def rnd(*shape, dtype=torch.float32, low=None, scale=1.0):
    """Random values, never all zeros; `low` gives uniform values in [low, low + scale)."""
    if low is not None:
        return (torch.rand(*shape) * scale + low).to(dtype)
    return (torch.randn(*shape) * scale).to(dtype)


def check_cases(cases: dict, tol=1e-5, precisions=("f64",), pipeline=False):
    """Many small programs captured as one (torch.export's fixed cost dominates small graphs):
    cases = {name: (fn, inputs)}; a failure names its case. pipeline=True also lowers the same
    capture through every stage, compiles the CUDA with NVRTC and runs the kernels in the
    simulator, checking those outputs too."""
    names, flat, spans = [], [], []
    for case, (fn, inputs) in cases.items():
        spans.append((case, fn, len(flat), len(inputs)))
        flat += list(inputs)
        names += [f"{case}_{k}" for k in range(len(inputs))]

    class Program(torch.nn.Module):        # modules among the cases keep their weights
        def __init__(self):
            super().__init__()
            self.mods = torch.nn.ModuleList([fn for _, fn, _, _ in spans
                                             if isinstance(fn, torch.nn.Module)])

        def forward(self, *args):
            outs = []
            for case, fn, start, n in spans:
                r = fn(*args[start:start + n])
                outs += list(r) if isinstance(r, (tuple, list)) else [r]
            return tuple(outs)

    prog = capture(Program(), flat, input_names=names)
    tprog = to_tensor_ir(prog)
    tprog.verify()
    feed = {n: to_numpy(x) for n, x in zip(names, flat)}
    results = {p: evaluate(tprog, feed, p) for p in precisions}
    if pipeline:
        results["sim"] = _through_pipeline(prog, feed)
    k = 0
    for case, fn, start, n in spans:
        with torch.no_grad():
            r = fn(*flat[start:start + n])
        for ref in (list(r) if isinstance(r, (tuple, list)) else [r]):
            o = tprog.outputs[k]
            k += 1
            assert tprog.node(o).type.dtype == dtypes.from_torch(ref.dtype), f"{case}: dtype"
            for p, outs in results.items():
                compare(f"{case} ({p})", outs[o], ref, tol)
    return tprog


def _through_pipeline(prog, feed: dict) -> dict:
    """{Tensor IR output name: simulated kernel output} for a captured program."""
    from strata.kernel_ir.sim import simulate
    from strata.pipeline import lower_torch_program
    from strata.runtime.nvrtc import compile_cuda
    low = lower_torch_program(prog)
    verify_program(low.kernel)
    compile_cuda(low.source, "sm_90", want="ptx")
    feed = {**feed, **{k: to_numpy(v) for k, v in prog.weights.items()}}
    got = simulate(low.kernel, feed)
    outs = [got[o] if o in got else feed[o] for o in low.kernel.outputs]
    tprog = low.tensor
    return dict(zip(tprog.outputs, outs))
