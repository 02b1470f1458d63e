"""An external check: every PyTorch OpInfo sample (CPU, float32) of every in-scope op, zero-size
and 0-d ones included, each also with its inputs strided and transposed, through the whole
pipeline (strata.compile, NVRTC, the simulator) and strata.check.verify (values against eager
float64, shape, dtype, output count), and through the Tensor IR evaluator.

strata/bench/opinfo_cases.py builds and runs the cases (one program per op; a failing program
is split until each error has its own sample); `python -m strata.bench.opinfo_report` prints the
same as a table (docs/opinfo.md). A sample strata cannot take must be a clear StrataError, and
only the ones listed in UNSUPPORTED may be: anything else that goes wrong is a failure.
"""
import re

import pytest

pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest")

from strata.bench import opinfo_cases as oc  # noqa: E402

OPS = oc.in_scope_ops()

# op -> what strata says for the samples it cannot take (every other sample must pass)
UNSUPPORTED = {
    # torch.narrow(x, dim, start) with `start` a 0-d tensor: the slice offset is data
    "narrow": r"depends on the data|PendingUnbackedSymbolNotFound",
    # embedding(max_norm=...) renormalises rows of the weight in place (aten.embedding_renorm_)
    "nn.functional.embedding": r"^unsupported op aten\.embedding_renorm",
}


@pytest.mark.parametrize("op", OPS, ids=oc.op_id)
def test_opinfo(op):
    result = oc.run_op(op)
    assert result.outcomes, f"{result.op}: no sample ({result.excluded})"
    failed = [f"{o.case} ({o.what}): {o.cause}" for o in result.outcomes if o.status == oc.FAILED]
    assert not failed, f"{result.op}: {len(failed)} of {len(result.outcomes)} samples failed:\n" \
        + "\n".join(failed)
    allowed = UNSUPPORTED.get(result.op)
    unexpected = [f"{o.case} ({o.what}): {o.cause}" for o in result.outcomes
                  if o.status == oc.UNSUPPORTED and not (allowed and re.search(allowed, o.cause))]
    assert not unexpected, f"{result.op}: samples strata now refuses:\n" + "\n".join(unexpected)
