"""The rule for `aten.scaled_dot_product_attention`: the explicit softmax(q @ k^T * s + mask) @ v.

It is decomposed into the same nodes a user's own attention gives (matmul, scale, mask,
softmax, matmul), so that one recogniser (loop/attention_match.py) fuses both into one
flash-attention kernel. Torch's conventions: `is_causal` keeps key j for query i where j <= i
(top-left aligned, also when Lq != Lk); a boolean mask keeps where true, a float mask is added;
`enable_gqa` shares each KV head among Hq / Hk query heads (head h reads KV head h // (Hq / Hk));
a row whose every score is -inf gives zeros (torch's safe softmax), not NaN.
"""
from __future__ import annotations

import math

from ..core.errors import UnsupportedOp
from ..core.expr import Const, Var, call
from .builder import T, rule
from .rules_matmul import matmul


def _share_kv_heads(b, x: T, hq: int) -> T:
    """K or V with its Hk heads broadcast to Hq query heads (head h reads KV head h // rep)."""
    hk = x.shape[-3]
    if hk == hq:
        return x
    rep = hq // hk
    shape = (*x.shape[:-3], hq, *x.shape[-2:])
    index = tuple(Var(f"i{d}") for d in range(x.rank))
    h = x.rank - 3
    index = index[:h] + (call("floordiv", Var(f"i{h}"), Const(rep)),) + index[h + 1:]
    return b.index_map(x, shape, index, hint=f"{x.name}_gqa", prefix=False)


def _causal(b, x: T, transposed: bool = False) -> T:
    """Scores with key j > query i replaced by -inf (keys on the rows when transposed)."""
    r = x.rank
    keep = call("le", *(Var(f"i{r - 2}"), Var(f"i{r - 1}"))[::1 if transposed else -1])
    return b.index_map(x, x.shape, tuple(Var(f"i{d}") for d in range(r)), valid=keep,
                       fill=float("-inf"), hint="causal")


@rule("aten.scaled_dot_product_attention")
def sdpa(b, a):
    q, k, v = a.query, a.key, a.value
    if a.get("dropout_p", 0.0):
        raise UnsupportedOp("aten.scaled_dot_product_attention with dropout_p > 0")
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise UnsupportedOp("aten.scaled_dot_product_attention with operands of different ranks")
    if a.get("enable_gqa", False) and q.rank >= 3 and k.shape[-3] != q.shape[-3]:
        if q.shape[-3] % k.shape[-3] or q.shape[-3] % v.shape[-3]:
            raise UnsupportedOp("aten.scaled_dot_product_attention with enable_gqa and query "
                                "heads that are not a multiple of the KV heads")
        k, v = _share_kv_heads(b, k, q.shape[-3]), _share_kv_heads(b, v, q.shape[-3])
    dt = b.out.dtype
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mask = a.get("attn_mask")
    if a.get("is_causal", False) and mask is not None:
        raise UnsupportedOp("aten.scaled_dot_product_attention with both attn_mask and "
                            "is_causal (torch rejects it too)")
    x = _masked(b, _scaled_scores(b, q, k, scale, a.get("is_causal", False), dt), mask, dt)
    p, _ = _softmax(b, x, dt)
    return matmul(b, p, v)


def _scaled_scores(b, q: T, k: T, scale: float, causal: bool, dt: str, math: str = "",
                   transposed: bool = False) -> T:
    """q @ k^T * scale, the product in dt and the rest in `math` (dt if not given), -inf past the
    causal diagonal (keys on the rows when transposed)."""
    s = matmul(b, q, k, transposed=True, hint="scores", dtype=dt)
    x = b.ew("multiply", b.cast(s, math or dt), scale, hint="scaled")
    return _causal(b, x, transposed) if causal else x


def _masked(b, x: T, mask: T | None, dt: str, transposed: bool = False) -> T:
    """x where a boolean mask holds (-inf elsewhere), or x + a float mask; the mask broadcast to
    the scores (*batch, Lq, Lk), read transposed when x has the keys on its rows."""
    if mask is None:
        return x
    if transposed:
        r = x.rank
        full = b.bcast(mask, (*x.shape[:-2], x.shape[-1], x.shape[-2]))
        index = [Var(f"i{d}") for d in range(r)]
        index[-2], index[-1] = index[-1], index[-2]
        mask = b.index_map(full, x.shape, tuple(index), hint="mask_t")
    if mask.dtype == "bool":
        return b.ew("where", mask, x, float("-inf"), dtype=dt, hint="masked")
    return b.ew("add", x, b.cast(mask, dt), hint="masked")


def _softmax(b, x: T, dt: str, lse: bool = False) -> tuple[T, T | None]:
    """(safe softmax of x over its last axis, its log-sum-exp with keepdim if asked)."""
    axis = x.rank - 1
    m = b.reduce("max", x, (axis,), hint="max")
    e = b.ew("exp", b.ew("subtract", x, m, hint="shifted"))
    total = b.reduce("sum", e, (axis,), hint="sum")
    p = b.ew("divide", e, total, hint="softmax")
    empty = b.ew("eq", m, float("-inf"), hint="empty")        # every score masked: weights 0
    p = b.ew("where", empty, 0.0, p, dtype=dt, hint="weights")
    if not lse:
        return p, None
    # -inf for a row with no key (max + log(sum) is NaN there: exp(-inf - -inf))
    return p, b.ew("where", empty, float("-inf"), b.ew("add", m, b.ew("log", total)), dtype=dt,
                   hint="lse")


def _acc(dtype: str) -> str:
    return "f64" if dtype == "f64" else "f32"


@rule("strata.attention")
def attention(b, a):
    """torch_compile/attention_op.py's forward: (out, lse), the lse read off the softmax's own
    max and sum so that the fused kernel (loop/attention_match.py) writes it too."""
    q, k, v = a.q, a.k, a.v
    if q.rank >= 3:                     # GQA: k and v may have fewer heads
        k, v = _share_kv_heads(b, k, q.shape[-3]), _share_kv_heads(b, v, q.shape[-3])
    acc = _acc(q.dtype)
    # the product in q's dtype (a tensor-core schedule takes bf16/f16 operands), softmax in acc
    x = _masked(b, _scaled_scores(b, q, k, float(a.scale), a.causal, q.dtype, acc), a.mask, acc)
    p, lse = _softmax(b, x, acc, lse=True)
    # p @ v in q's dtype, as SDPA's rule does: the kernel stores it, no cast kernel after
    return matmul(b, p, v, dtype=q.dtype), b.squeeze(lse, (lse.rank - 1,), hint="lse")


@rule("strata.attention_backward")
def attention_backward(b, a):
    """(dq, dk, dv) as torch_compile/attention_op.py spells them. Each gradient is a sum over
    keys (dq) or queries (dk, dv) of weights rebuilt from q, k and the saved log-sum-exp times
    one operand, so each is its own flash kernel (the sum form of the Attention statement): dk
    and dv walk the scores transposed, key rows against query columns; nothing Lq x Lk is kept."""
    g, q, k0, v0, out, lse = a.grad, a.q, a.k, a.v, a.out, a.lse
    k, v = k0, v0
    if q.rank >= 3:                     # GQA: k and v may have fewer heads
        k, v = _share_kv_heads(b, k, q.shape[-3]), _share_kv_heads(b, v, q.shape[-3])
    acc, scale, causal = _acc(q.dtype), float(a.scale), a.causal
    lse = b.ew("where", b.ew("eq", lse, float("-inf")), 0.0, b.cast(lse, acc), dtype=acc,
               hint="lse_safe")
    rows = b.reduce("sum", b.ew("multiply", b.cast(g, acc), b.cast(out, acc)), (g.rank - 1,),
                    hint="grad_dot_out")                         # (*b, Lq, 1)
    lse_row = b.reshape(lse, (*lse.shape, 1))
    lse_col = b.reshape(lse, (*lse.shape[:-1], 1, lse.shape[-1]))
    rows_col = b.reshape(rows, lse_col.shape)

    def weights(a_: T, b_: T, lse_: T, transposed: bool) -> T:
        x = _masked(b, _scaled_scores(b, a_, b_, scale, causal, q.dtype, acc, transposed), a.mask,
                    acc, transposed)
        return b.ew("exp", b.ew("subtract", x, lse_, hint="shifted"), hint="weights")

    def grad_scores(p: T, a_: T, b_: T, rows_: T) -> T:
        dp = b.cast(matmul(b, a_, b_, transposed=True, hint="grad_weights", dtype=q.dtype), acc)
        return b.ew("multiply", b.ew("multiply", p, b.ew("subtract", dp, rows_)), scale,
                    hint="grad_scores")
    # each product in its gradient's dtype (the weights rounded to it first, as FlashAttention
    # rounds P and dS for its tensor cores): the kernel stores it, no cast kernel after
    dq = matmul(b, grad_scores(weights(q, k, lse_row, False), g, v, rows), k, dtype=q.dtype)
    dk = matmul(b, grad_scores(weights(k, q, lse_col, True), v, g, rows_col), q, dtype=k.dtype)
    dv = matmul(b, weights(k, q, lse_col, True), g, dtype=v.dtype)
    return dq, _folded(b, dk, k0), _folded(b, dv, v0)


def _folded(b, grad: T, x: T) -> T:
    """A gradient at the query heads summed over each KV head's group (GQA's backward)."""
    if grad.shape == x.shape:
        return grad
    hk = x.shape[-3]
    split = b.reshape(grad, (*x.shape[:-3], hk, grad.shape[-3] // hk, *x.shape[-2:]))
    return b.reshape(b.reduce("sum", split, (x.rank - 2,), hint="kv_heads"), x.shape)
