"""fp16 / bf16 programs: Tensor IR keeps storage dtypes; both evaluators stay within 1e-2."""
import pytest
import torch
import torch.nn.functional as F

from tensor_helpers import check_cases, rnd


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision(dtype):
    def r(*shape, **kw):
        return rnd(*shape, dtype=dtype, **kw)
    cases = {
        "add_mul": (lambda x, y: (x + y, x * y, x - 2.5 * y), (r(3, 5), r(5))),
        "unary": (lambda x: (torch.exp(x), torch.tanh(x), F.gelu(x), F.silu(x), torch.sigmoid(x),
                             torch.relu(x)), (r(4, 7),)),
        "reduce": (lambda x: (x.sum(-1), x.mean(0), x.amax(1), x.argmax(-1)), (r(3, 9),)),
        "softmax": (lambda x: (torch.softmax(x, -1), F.log_softmax(x, 0)), (r(5, 11),)),
        "rms_norm": (lambda x, w: F.rms_norm(x, (16,), w, eps=1e-6), (r(2, 3, 16), r(16))),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (16,), w, b), (r(3, 16), r(16), r(16))),
        "matmul": (lambda x, w: x @ w, (r(5, 24), r(24, 3, scale=0.2))),
        "linear": (F.linear, (r(2, 8), r(4, 8), r(4))),
        "casts": (lambda x: (x.float() * 2, (x.float() + 1).to(dtype), x.to(torch.float16)), (r(6),)),
        "mixed": (lambda x, y: x + y, (r(4), rnd(4))),         # promotes to f32
        "layout": (lambda x: (x.t(), torch.cat([x, x * 2], 0), x.reshape(-1)[::2]), (r(3, 4),)),
    }
    check_cases(cases, tol=1e-2, precisions=("f64", "native"))
