"""Gradients of PyTorch's OpInfo samples through torch.compile(backend="strata")'s training path
(strata/bench/opinfo_grad.py) against eager float64, for a cross-section of the ops a model
trains through: every sample's every input must match, none may be refused but as REFUSED
says. SDPA's run on the simulator, so they take the flash kernels (masks, causal, GQA). The whole table
(every differentiable op) is `python -m strata.bench.opinfo_grad` (docs/opinfo-grad.md)."""
import re

import pytest

pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest")

from strata.bench import opinfo_grad as og  # noqa: E402
from strata.bench.opinfo_cases import PASSED, UNSUPPORTED, op_id  # noqa: E402

OPS = ["softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.rms_norm", "mm",
       "bmm", "nn.functional.linear", "nn.functional.embedding", "gather", "index_select",
       "cumsum", "nn.functional.gelu", "nn.functional.silu", "var", "cat", "where", "amax",
       "logsumexp", "__getitem__", "nn.functional.scaled_dot_product_attention"]
BY_ID = {op_id(o): o for o in og.differentiable_ops()}
# op -> what strata says for the samples it cannot take (every other sample must pass)
REFUSED = {
    # max_norm renormalises the weight in place; sparse=True asks for a sparse gradient
    "nn.functional.embedding": r"unsupported op aten\.(embedding_renorm|_sparse_coo_tensor)",
    # a boolean mask's shape is data; index_put's backward of two index tensors
    "__getitem__": r"depends on the data|unsupported op aten\.index_put \(only one index tensor",
    # dropout is random: its samples are refused (strata has no random numbers)
    "nn.functional.scaled_dot_product_attention": r"unsupported op aten\.native_dropout",
}


@pytest.mark.parametrize("name", OPS)
def test_every_samples_gradient_matches_eager_float64(name):
    result = og.run_op(BY_ID[name])
    assert result.outcomes, f"{name}: no sample ({result.skipped})"
    allowed = REFUSED.get(name)
    bad = [f"{o.case} ({o.what}): {o.status}: {o.cause}" for o in result.outcomes
           if o.status != PASSED and not (o.status == UNSUPPORTED and allowed
                                           and re.search(allowed, o.cause))]
    assert not bad, f"{name}:\n" + "\n".join(bad)
