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


def _causal(b, x: T) -> T:
    """Scores with key j > query i replaced by -inf."""
    r = x.rank
    keep = call("le", Var(f"i{r - 1}"), Var(f"i{r - 2}"))
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
    scores = matmul(b, q, k, transposed=True, hint="scores")
    x = b.ew("multiply", scores, scale, hint="scaled")
    mask = a.get("attn_mask")
    if a.get("is_causal", False):
        if mask is not None:
            raise UnsupportedOp("aten.scaled_dot_product_attention with both attn_mask and "
                                "is_causal (torch rejects it too)")
        x = _causal(b, x)
    elif mask is not None and mask.dtype == "bool":
        x = b.ew("where", mask, x, float("-inf"), dtype=dt, hint="masked")
    elif mask is not None:
        x = b.ew("add", x, b.cast(mask, dt), hint="masked")
    axis = x.rank - 1
    m = b.reduce("max", x, (axis,), hint="max")
    e = b.ew("exp", b.ew("subtract", x, m, hint="shifted"))
    p = b.ew("divide", e, b.reduce("sum", e, (axis,), hint="sum"), hint="softmax")
    empty = b.ew("eq", m, float("-inf"), hint="empty")        # every score masked: weights 0
    p = b.ew("where", empty, 0.0, p, dtype=dt, hint="weights")
    return matmul(b, p, v)
