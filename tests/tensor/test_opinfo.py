"""An external check: every PyTorch OpInfo sample (CPU, float32) of every op strata lowers,
zero-size and 0-d ones included, each also with its inputs strided and transposed, through the whole
pipeline (strata.compile, NVRTC, the simulator) and strata.bench.check.verify (values against eager
float64, shape, dtype, output count), and through the Tensor IR evaluator.

strata/bench/opinfo_cases.py builds and runs the cases (one program per op; a failing program
is split until each error has its own sample); `python -m strata.bench.opinfo_report` prints the
same as a table (docs/opinfo.md). A sample strata cannot take must be a clear StrataError, and
only the ones listed in UNSUPPORTED may be: anything else that goes wrong is a failure.
"""
import re

import pytest

pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest")

from strata.bench import opinfo_cases as oc

OPS = oc.in_scope_ops()

# op -> what strata says for the samples it cannot take (every other sample must pass)
UNSUPPORTED = {
    # torch.narrow(x, dim, start) with `start` a 0-d tensor: the slice offset is data
    "narrow": r"depends on the data",
    # embedding(max_norm=...) renormalises rows of the weight in place (aten.embedding_renorm_)
    "nn.functional.embedding": r"^unsupported op aten\.embedding_renorm",
    # x[mask] with a boolean mask: the result's shape is data
    "__getitem__": r"depends on the data",
    "index_put": r"^unsupported op aten\.index_put \((only integer index tensors|only one index "
                 r"tensor, without accumulate)",
    "nn.functional.scaled_dot_product_attention": r"^unsupported op "
        r"aten\.scaled_dot_product_attention with (dropout_p > 0|operands of different ranks)",
}
# op -> why its failures are known: a fix outside strata's compiler that is pending
KNOWN_FAILURES: dict[str, str] = {}


def _params():
    for op in OPS:
        why = KNOWN_FAILURES.get(oc.op_id(op))
        marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
        yield pytest.param(op, id=oc.op_id(op), marks=marks)


@pytest.mark.parametrize("op", _params())
def test_opinfo(op):
    result = oc.run_op(op, max_failures=8)
    assert result.outcomes, f"{result.op}: no sample ({result.excluded})"
    failed = [f"{o.case} ({o.what}): {o.cause}" for o in result.outcomes if o.status == oc.FAILED]
    assert not failed, f"{result.op}: {len(failed)} of {len(result.outcomes)} samples failed:\n" \
        + "\n".join(failed)
    allowed = UNSUPPORTED.get(result.op)
    unexpected = [f"{o.case} ({o.what}): {o.cause}" for o in result.outcomes
                  if o.status == oc.UNSUPPORTED and not (allowed and re.search(allowed, o.cause))]
    assert not unexpected, f"{result.op}: samples strata now refuses:\n" + "\n".join(unexpected)
