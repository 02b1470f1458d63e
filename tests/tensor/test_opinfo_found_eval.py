"""Tensor IR evaluator bugs the OpInfo sweep (python -m strata.bench.opinfo_report --dtype
bfloat16) found; the pipeline ones are in tests/e2e/test_opinfo_found.py."""
import numpy as np
import torch

from strata.core import dtypes
from tensor_helpers import check


def test_bf16_rounding_keeps_a_0d_shape():
    # np.ascontiguousarray makes a 0-d array 1-d: a 0-d bf16 value came back with shape (1,)
    assert dtypes.round_to(np.asarray(1.5), "bf16").shape == ()
    assert dtypes.to_bf16_bits(np.float32(np.nan)).shape == ()
    assert dtypes.round_to(np.ones((2, 0, 3)), "bf16").shape == (2, 0, 3)


def test_0d_bf16_results_in_the_evaluator():
    # torch.dot of bf16 vectors and a bf16 cast of a sum are 0-d: the evaluator's values had
    # shape (1,) (or raised "cannot broadcast a non-scalar to a scalar array" further on)
    x = torch.randn(7).bfloat16()
    check(lambda a, b: torch.dot(a, b), x, x.flip(0), tol=1e-2, precisions=("f64", "native"))
    check(lambda a: a.sum().bfloat16() * 2, torch.randn(5, 3), tol=1e-2,
          precisions=("f64", "native"))
