"""Rules for the matmul family: mm, bmm, matmul, linear, addmm.

A matmul is written the way seed 002's Tensor IR shows it: both operands broadcast by IndexMaps
to (*batch, M, K, N), one multiply, a keepdim sum over K, and an IndexMap that squeezes K (and
the M/N dims a 1-D operand does not have). A transposed weight (linear) is only an index swap.
"""
from __future__ import annotations

from ..core.errors import UnsupportedOp
from ..core.expr import Const, Var
from .builder import T, broadcast_shapes, rule


def _operand_index(x: T, batch_rank: int, batch: tuple, mk: str, transposed: bool):
    """Index of operand x into the product space (*batch, M, K, N)."""
    iM, iK, iN = (Var(f"i{batch_rank + k}") for k in range(3))
    if x.rank == 1:
        return (iK,)
    rows, cols = (iM, iK) if mk == "a" else (iK, iN)
    if transposed:
        rows, cols = cols, rows
    xb = x.shape[:-2]
    index = []
    for d, n in enumerate(xb):
        od = d + len(batch) - len(xb)
        index.append(Const(0) if n == 1 and batch[od] != 1 else Var(f"i{od}"))
    return (*index, rows, cols)


def matmul(b, a: T, w: T, transposed: bool = False, hint: str = "", dtype: str = "") -> T:
    """a @ w (or a @ w.T when `transposed`), any ranks torch.matmul accepts; the operands are
    cast to `dtype` (the node's output dtype unless given) and summed in it."""
    M = a.shape[-2] if a.rank > 1 else 1
    K = a.shape[-1]
    N = 1 if w.rank == 1 else (w.shape[-2] if transposed else w.shape[-1])
    batch = broadcast_shapes(a.shape[:-2], w.shape[:-2])
    br = len(batch)
    shape = (*batch, M, K, N)
    dt = dtype or b.out.dtype
    a_bc = b.index_map(b.cast(a, dt), shape, _operand_index(a, br, batch, "a", False),
                       hint=f"{a.name}_bc", prefix=False)
    w_bc = b.index_map(b.cast(w, dt), shape, _operand_index(w, br, batch, "w", transposed),
                       hint=f"{w.name}_bc", prefix=False)
    prod = b.ew("multiply", a_bc, w_bc, hint="prod")
    red = b.reduce("sum", prod, (br + 1,), hint="red")
    index = [Var(f"i{d}") for d in range(br)]
    k = br
    if a.rank > 1:
        index.append(Var(f"i{k}"))
        k += 1
    else:
        index.append(Const(0))
    index.append(Const(0))
    index.append(Var(f"i{k}") if w.rank > 1 else Const(0))
    out_shape = (*batch, *((M,) if a.rank > 1 else ()), *((N,) if w.rank > 1 else ()))
    return b.index_map(red, out_shape, tuple(index), hint=hint or "out")


@rule("aten.mm", "aten.bmm", "aten.matmul")
def mm(b, a):
    return matmul(b, a.self, a.other if "other" in a else a.mat2)


@rule("aten._scaled_mm")
def scaled_mm(b, a):
    """torch._scaled_mm (FP8 operands on Hopper): the product in f32, times scale_a (one scale, or
    a column [M, 1]) and scale_b (one, or a row [1, N]), plus bias, rounded to out_dtype."""
    if a.get("scale_result") is not None:
        raise UnsupportedOp("aten._scaled_mm with scale_result")
    y = matmul(b, a.self, a.mat2, hint="mm", dtype="f32")
    for scale in (a.scale_a, a.scale_b):
        y = b.ew("multiply", y, b.cast(scale, "f32"), hint="scaled")
    if a.get("bias") is not None:
        y = b.ew("add", y, b.cast(a.bias, "f32"))
    return b.cast(y, b.out.dtype)


@rule("aten.linear")
def linear(b, a):
    y = matmul(b, a.input, a.weight, transposed=True, hint="mm" if a.get("bias") is not None else "")
    if a.get("bias") is None:
        return y
    return b.ew("add", y, b.cast(a.bias, y.dtype))


@rule("aten.addmm")
def addmm(b, a):
    y = matmul(b, a.mat1, a.mat2, hint="mm")
    if a.get("alpha", 1) != 1:
        y = b.ew("multiply", y, a.alpha, hint="alpha")
    bias = b.cast(a.self, y.dtype)
    if a.get("beta", 1) != 1:
        bias = b.ew("multiply", bias, a.beta, hint="beta")
    return b.ew("add", bias, y)
