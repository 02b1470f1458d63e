"""`python -m strata.bench.opinfo_grad`: the gradients of PyTorch's OpInfo samples through
`torch.compile(backend="strata")`'s training path, against eager in float64 (issue 58).

Each differentiable in-scope op (strata/bench/opinfo_cases.py's, `supports_autograd`) is one
module of all its float32 samples (their strided twins left to the forward check); its float
inputs require grad, and the loss is the sum of each float output times fixed random weights, so
one backward reaches every input. AOTAutograd splits the module into a forward and a backward
program, both compiled by strata (the simulator by default: the rules are the CPU's and the
GPU's, and the GPU path's own choices, the flash attention, are taken there). Each input's
gradient must match eager's float64 one at the float32 tolerance of docs/design.md (a
contraction's); an op whose gradient strata cannot compile must say so in one StrataError (its
row says which); anything else is a failure. A group that fails is run sample by sample to
attribute it. Writes a markdown table (docs/opinfo-grad.md).

    python -m strata.bench.opinfo_grad                       # every differentiable op
    python -m strata.bench.opinfo_grad --op softmax --op cumsum --device cpu
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import date

from ..core.command import guarded
from ..core.errors import StrataError
from .opinfo_cases import FAILED, PASSED, UNSUPPORTED, Outcome, cases, first_line, group_module, \
    in_scope_ops, op_id


ATOL = 1e-5    # float32's own noise on O(1) gradients (torch.testing's default atol): a
               # gradient that is 0 in exact arithmetic (a layer norm over one element) is ~1e-8


@dataclass
class GradResult:
    op: str
    outcomes: list = field(default_factory=list)
    skipped: str = ""           # why the op has no gradient case
    excluded: list = field(default_factory=list)    # samples whose eager backward raises

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)


class _EagerRejects(Exception):
    pass


def differentiable_ops() -> tuple:
    return tuple(op for op in in_scope_ops() if op.supports_autograd)


def _float(t) -> bool:
    return t.is_floating_point()


def _grads(module, inputs, weights, double: bool) -> list:
    """Each float input's gradient of sum(output * weight) (None where it has none)."""
    import torch
    xs = [t.detach().double() if double and _float(t) else t.detach().clone() for t in inputs]
    for t in xs:
        if _float(t):
            t.requires_grad_(True)
    outs = module(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o * (w.double() if double else w)).sum() for o, w in zip(outs, weights)
               if w is not None and o.requires_grad)
    if not torch.is_tensor(loss):
        return [None] * len(xs)
    got = torch.autograd.grad(loss, [t for t in xs if _float(t)], allow_unused=True)
    it = iter(got)
    return [next(it) if _float(t) else None for t in xs]


def _check_group(group, device: str) -> list[Outcome]:
    """Outcomes of the cases compiled as one module (all PASSED, or an exception propagates;
    a mismatch is a FAILED outcome of the case it belongs to)."""
    import torch
    from .check import compare, tolerance
    module = group_module(group)
    inputs = [t for c in group for t in c.inputs]
    with torch.no_grad():
        outs = module(*inputs)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(o.shape, generator=gen) if o.is_floating_point() else None for o in outs]
    try:
        ref = _grads(module, inputs, weights, double=True)
    except Exception as e:  # noqa: BLE001 -- eager's own backward refuses the sample
        raise _EagerRejects(first_line(str(e))) from None
    torch._dynamo.reset()
    # one graph, or an error: no part may run eagerly (a sample's own frame recompiled past
    # dynamo's limit, a graph break), or eager would be checked against itself
    fast = torch.compile(module, backend="strata", dynamic=False, fullgraph=True,
                         options={"device": device})
    with torch._dynamo.config.patch(recompile_limit=10 ** 6, fail_on_recompile_limit_hit=True):
        got = _grads(fast, inputs, weights, double=False)
    out, start = [], 0
    for c in group:
        bad = []
        for k in range(start, start + len(c.inputs)):
            g, r = got[k], ref[k]
            if (g is None) != (r is None):
                bad.append(f"input {k - start}: gradient {'missing' if g is None else 'unexpected'}")
            elif g is not None:
                res = compare(f"input {k - start}", "f32", g.numpy(force=True),
                              r.numpy(force=True), tolerance("f32", True))   # force: ZeroTensors
                if not res.passed and not (res.max_abs <= ATOL and not res.problem):
                    bad.append(res.problem or f"input {k - start}: rel err {res.rel:.3g}, max abs "
                               f"{res.max_abs:.3g} (tol {res.tol})")
        start += len(c.inputs)
        out.append(Outcome(c.name, FAILED if bad else PASSED, "; ".join(bad), c.what))
    return out


def _run(group, device: str, excluded: list) -> list[Outcome]:
    try:
        try:
            return _check_group(group, device)
        except _EagerRejects:
            raise
        except Exception as e:  # noqa: BLE001 -- dynamo wraps the backend's error
            inner = getattr(e, "inner_exception", None)
            raise (inner if inner is not None else e) from None
    except _EagerRejects as e:
        if len(group) == 1:
            excluded.append((group[0].name, f"eager's backward raises: {e}"))
            return []
    except StrataError as e:
        if len(group) == 1:
            return [Outcome(group[0].name, UNSUPPORTED, first_line(str(e)), group[0].what)]
    except _dynamo_unsupported() as e:      # dynamo cannot trace the sample in one graph
        if len(group) == 1:
            return [Outcome(group[0].name, UNSUPPORTED, "dynamo: " + first_line(str(e)),
                            group[0].what)]
    except Exception as e:  # noqa: BLE001 -- any other error is a failure of its sample
        if len(group) == 1:
            cause = f"{type(e).__name__}: {first_line(str(e))}"
            return [Outcome(group[0].name, FAILED, cause, group[0].what)]
    return [o for c in group for o in _run([c], device, excluded)]


def _dynamo_unsupported():
    from torch._dynamo.exc import Unsupported
    return Unsupported


class _Direct:
    """An OpInfo whose op is torch's own function, not its test wrapper (SDPA's wrapper sets the
    seed for dropout, and dynamo will not trace it)."""

    def __init__(self, op, fn):
        self.op, self.sample_inputs = fn, op.sample_inputs


def _direct(op):
    import torch
    if op_id(op) == "nn.functional.scaled_dot_product_attention":
        return _Direct(op, torch.nn.functional.scaled_dot_product_attention)
    return op


def run_op(op, device: str = "sim") -> GradResult:
    import torch
    torch.manual_seed(0)
    result = GradResult(op_id(op))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found, _ = cases(_direct(op))
        base = [c for c in found if "." not in c.name and any(
            _float(t) and t.numel() for t in c.inputs)]
        if not base:
            result.skipped = "no sample with a float input"
            return result
        result.outcomes = _run(base, device, result.excluded)
    return result


def _row(r: GradResult) -> str:
    why = sorted({f"{o.status}: {o.cause}" for o in r.outcomes if o.status != PASSED})
    cells = [r.op, len(r.outcomes), r.count(PASSED), r.count(UNSUPPORTED), r.count(FAILED),
             r.skipped or "; ".join(why)[:400]]
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.opinfo_grad",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--op", action="append", default=[], help="an OpInfo name (repeatable)")
    p.add_argument("--device", choices=("sim", "cpu"), default="sim")
    p.add_argument("-o", "--out", default="docs/opinfo-grad.md", help="the markdown report")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks")
    args = p.parse_args(argv)

    def command() -> int:
        ops = differentiable_ops()
        if args.op:
            known = {op_id(o) for o in ops}
            if unknown := [o for o in args.op if o not in known]:
                raise StrataError(f"no differentiable in-scope OpInfo named {', '.join(unknown)}")
            ops = tuple(o for o in ops if op_id(o) in args.op)
        t0, results = time.monotonic(), []
        for k, op in enumerate(ops):
            print(f"[{k + 1}/{len(ops)}] {op_id(op)}", file=sys.stderr, flush=True)
            results.append(run_op(op, args.device))
        n = sum(len(r.outcomes) for r in results)
        passed = sum(r.count(PASSED) for r in results)
        lines = ["# OpInfo gradients through torch.compile(backend=\"strata\")", "",
                 f"`python -m strata.bench.opinfo_grad --device {args.device}`, {date.today()}: "
                 f"{n} samples of {len(results)} differentiable ops, {passed} passed, "
                 f"{sum(r.count(UNSUPPORTED) for r in results)} refused in one sentence, "
                 f"{sum(r.count(FAILED) for r in results)} failed "
                 f"({time.monotonic() - t0:.0f} s).", "",
                 "| op | samples | passed | unsupported | failed | why |", "|---|---|---|---|---|---|"]
        lines += [_row(r) for r in results]
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(lines[2], file=sys.stderr)
        return 0
    return guarded(command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
