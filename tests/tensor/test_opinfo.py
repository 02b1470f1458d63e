"""An external check: PyTorch's own OpInfo sample inputs (CPU, float32) for the in-scope ops,
through the Tensor IR evaluator (float64) and through the whole pipeline (kernels compiled by
NVRTC and run in the simulator, float32).

All samples of one op are captured as one program. Samples outside strata's scope (zero-size
tensors, non-tensor outputs, ops strata reports as unsupported) are skipped with the reason;
anything else that goes wrong is a failure.
"""
import warnings

import pytest
import torch
import torch.utils._pytree as pytree

from strata.errors import CompileError, SimError, StrataError
from tensor_helpers import check_cases

pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

IN_SCOPE = """abs add addmm amax amin argmax argmin bmm cat ceil clamp clamp_max clamp_min clone
contiguous cos div eq erf exp exp2 expand expm1 flip floor floor_divide fmod full_like gather ge gt
index_select le lerp log log1p log_softmax logical_and logical_not logical_or logical_xor logsumexp
lt masked_fill matmul max maximum mean min minimum mm mul narrow ne neg nn.functional.embedding
nn.functional.gelu nn.functional.layer_norm nn.functional.linear nn.functional.normalize
nn.functional.relu nn.functional.rms_norm nn.functional.silu ones_like permute pow prod reciprocal
remainder repeat reshape roll round rsqrt select sigmoid sign sin slice softmax sqrt square
squeeze stack std std_mean sub sum t tanh transpose tril triu trunc unsqueeze var var_mean view
where zeros_like cumsum diff""".split()
MATMUL = {"addmm", "bmm", "matmul", "mm", "nn.functional.linear"}
MAX_SAMPLES = 6
OPS = [o for o in op_db if o.name in IN_SCOPE and o.variant_test_name in ("", "unbiased", "binary",
       "reduction_no_dim", "reduction_with_dim", "no_rounding_mode", "floor_rounding",
       "trunc_rounding", "multiple", "decimals_3", "with_dtype")]


def _case(op, sample):
    """(fn, tensors) for one sample, or a reason to skip it."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if any(t.numel() == 0 for t in tensors):
        return "zero-size tensor"
    if any(t.dtype.is_complex for t in tensors):
        return "complex tensor"
    slots = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def fn(*ts):
        vals = list(leaves)
        for k, t in zip(slots, ts):
            vals[k] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        out = op.op(inp, *args, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else out

    with torch.no_grad():
        out = fn(*tensors)
    outs = out if isinstance(out, tuple) else (out,)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        return "non-tensor output"
    if any(o.numel() == 0 for o in outs):
        return "zero-size output"
    return fn, tuple(t.detach().clone() for t in tensors)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name + ("." + o.variant_test_name if o.variant_test_name else ""))
def test_opinfo(op):
    cases, skipped = {}, []
    for k, sample in enumerate(op.sample_inputs("cpu", torch.float32)):
        if len(cases) == MAX_SAMPLES:
            break
        case = _case(op, sample)
        if isinstance(case, str):
            skipped.append(case)
        else:
            cases[f"sample{k}"] = case
    if not cases:
        pytest.skip(f"no usable sample: {sorted(set(skipped))}")
    tol = 1e-4 if op.name in MATMUL else 1e-5
    try:
        check_cases(cases, tol=tol, pipeline=True)
    except (SimError, CompileError):   # a kernel that races, reads out of bounds or fails NVRTC
        raise
    except StrataError:     # an unsupported op, or a data-dependent sample export cannot capture
        unsupported = []
        for name, case in cases.items():       # find the samples strata does not cover
            try:
                check_cases({name: case}, tol=tol, pipeline=True)
            except StrataError as e:
                unsupported.append(f"{name}: {e}")
        if len(unsupported) == len(cases):
            pytest.skip("; ".join(unsupported))
        if unsupported:
            warnings.warn("skipped OpInfo samples: " + "; ".join(unsupported))
