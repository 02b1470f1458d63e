"""The matmul family as broadcast-multiply-reduce, vs torch eager (fp32 tolerance 1e-4)."""
import torch
import torch.nn.functional as F

from strata.frontend.capture import capture
from strata.tensor.decompose import to_tensor_ir
from tensor_helpers import check_cases, rnd


def test_matmul_family():
    check_cases({
        "mm": (torch.mm, (rnd(5, 7), rnd(7, 3))),
        "bmm": (torch.bmm, (rnd(2, 5, 7), rnd(2, 7, 3))),
        "vec_mat": (torch.matmul, (rnd(7), rnd(7, 3))),
        "mat_vec": (torch.matmul, (rnd(5, 7), rnd(7))),
        "dot": (torch.matmul, (rnd(7), rnd(7))),
        "batched": (torch.matmul, (rnd(2, 1, 3, 4), rnd(5, 4, 6))),
        "batch_vec": (torch.matmul, (rnd(3, 5, 4), rnd(4))),
        "vec_batch": (torch.matmul, (rnd(4), rnd(3, 4, 2))),
        "linear": (F.linear, (rnd(3, 4, 5), rnd(6, 5), rnd(6))),
        "linear_nobias": (F.linear, (rnd(4, 5), rnd(6, 5))),
        "linear_vec": (F.linear, (rnd(5), rnd(6, 5), rnd(6))),
        "addmm": (lambda b, x, w: (torch.addmm(b, x, w), torch.addmm(b, x, w, beta=0.5, alpha=2)),
                  (rnd(3), rnd(4, 5), rnd(5, 3))),
        "module": (torch.nn.Linear(5, 3), (rnd(2, 5),)),
        "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), (rnd(2, 3, 4), rnd(2, 4, 5))),
        "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b), (rnd(2, 3, 5), rnd(2, 3, 4), rnd(2, 4, 5))),
        "seed": (lambda x, b, w: torch.relu(torch.matmul(x + b, w)), (rnd(16, 64), rnd(64), rnd(64, 16))),
    }, tol=1e-4)


def test_seed_matmul_tensor_ir():
    """The seed's relu(matmul(x + bias, w)) lowers to the Tensor IR seed 002 shows."""
    prog = to_tensor_ir(capture(lambda x, bias, w: torch.relu(torch.matmul(x + bias, w)),
                                (rnd(16, 64), rnd(64), rnd(64, 16))))
    lines = str(prog).splitlines()
    body = [line.split("->")[0].split("=", 1)[1].strip() for line in lines if " = " in line]
    assert body == ["bias[i1]", "add(x, bias_bc)", "add[i0, i1]", "w[i1, i2]",
                    "multiply(add_bc, w_bc)", "sum(matmul_prod, axis=1)", "matmul_red[i0, 0, i1]",
                    "relu(matmul)"], body
    assert any("(16, 64, 16) f32" in line for line in lines)
