"""Rules for pointwise aten ops: arithmetic, math functions, comparisons, logic, bits, casts.

Type promotion follows torch: the result dtype torch.export recorded (`b.out.dtype`) is the
dtype an op computes in, so operands are cast to it first (int + float -> float, int / int ->
float); comparisons cast both sides to their promoted type and yield bool.
"""
from __future__ import annotations

import math

from ..core import dtypes
from .builder import T, rule

UNARY = {
    "aten.neg": "negative", "aten.abs": "abs", "aten.exp": "exp", "aten.exp2": "exp2",
    "aten.log": "log", "aten.log1p": "log1p", "aten.expm1": "expm1", "aten.sqrt": "sqrt",
    "aten.rsqrt": "rsqrt", "aten.reciprocal": "reciprocal", "aten.square": "square",
    "aten.tanh": "tanh", "aten.sigmoid": "sigmoid", "aten.relu": "relu", "aten.erf": "erf",
    "aten.sin": "sin", "aten.cos": "cos", "aten.floor": "floor", "aten.ceil": "ceil",
    "aten.trunc": "trunc", "aten.sign": "sign",
}
BINARY = {"aten.add": "add", "aten.sub": "subtract", "aten.mul": "multiply",
          "aten.div": "divide", "aten.true_divide": "divide", "aten.minimum": "minimum",
          "aten.maximum": "maximum"}
COMPARE = {"aten.eq": "eq", "aten.ne": "ne", "aten.lt": "lt", "aten.le": "le", "aten.gt": "gt",
           "aten.ge": "ge"}
LOGICAL = {"aten.logical_and": "logical_and", "aten.logical_or": "logical_or",
           "aten.logical_xor": "logical_xor", "aten.bitwise_and": "logical_and",
           "aten.bitwise_or": "logical_or", "aten.bitwise_xor": "logical_xor",
           "aten.__and__": "logical_and", "aten.__or__": "logical_or",
           "aten.__xor__": "logical_xor"}
SHIFT = {"aten.__lshift__": "left_shift", "aten.bitwise_left_shift": "left_shift",
         "aten.__rshift__": "right_shift", "aten.bitwise_right_shift": "right_shift"}


def promote(*xs) -> str:
    """torch's result dtype for operands that are `T`s or Python scalars."""
    import torch

    def dummy(x):
        if isinstance(x, T):
            return torch.empty((1,) * x.rank, dtype=dtypes.to_torch(x.dtype))
        return x
    cur = dummy(xs[0])
    for x in xs[1:]:
        dt = torch.result_type(cur, dummy(x))
        rank = max([v.rank for v in xs if isinstance(v, T)], default=0)
        cur = torch.empty((1,) * rank, dtype=dt)
    return dtypes.from_torch(cur.dtype)


def other_of(a):
    return a["other"] if "other" in a else a.get("exponent")


@rule(*UNARY)
def unary(b, a):
    if b.op == "aten.sign" and a.self.dtype == "bool":    # sign(True) is True: no math to do
        return a.self
    return b.arith(UNARY[b.op], a.self, dtype=b.out.dtype, hint=UNARY[b.op])


@rule("aten.log2", "aten.log10")
def log_base(b, a):
    base = 2.0 if b.op == "aten.log2" else 10.0
    ln = b.arith("log", a.self, dtype=b.out.dtype, hint="ln")
    return b.ew("multiply", ln, 1.0 / math.log(base))


@rule("aten.round")
def round_(b, a):
    decimals = a.get("decimals") or 0
    if not decimals:
        return b.arith("round", a.self, dtype=b.out.dtype)
    scaled = b.arith("multiply", a.self, 10.0 ** decimals, dtype=b.out.dtype, hint="scaled")
    return b.ew("divide", b.ew("round", scaled), 10.0 ** decimals)


@rule("aten.isnan")
def isnan(b, a):
    return b.ew("isnan", a.self)


@rule("aten.isinf", "aten.isfinite")
def isinf(b, a):
    x = a.self
    if not dtypes.is_float(x.dtype):
        return b.full(x.shape, b.op == "aten.isfinite", "bool")
    inf = b.ew("eq", b.ew("abs", x), float("inf"), hint="inf")
    if b.op == "aten.isinf":
        return inf
    return b.ew("logical_not", b.ew("logical_or", inf, b.ew("isnan", x), hint="nonfinite"))


@rule("aten.isposinf", "aten.isneginf")
def isposinf(b, a):
    """What nan_to_num decomposes into."""
    x = a.self
    if not dtypes.is_float(x.dtype):
        return b.full(x.shape, False, "bool")
    return b.ew("eq", x, float("inf") if b.op == "aten.isposinf" else float("-inf"))


@rule(*BINARY)
def binary(b, a):
    op, x, y = BINARY[b.op], a.self, a.other
    dt = b.out.dtype
    if a.get("alpha") not in (None, 1):
        y = b.arith("multiply", y, a.alpha, dtype=dt, hint="alpha") if isinstance(y, T) else y * a.alpha
    mode = a.get("rounding_mode")
    if mode is None:
        return b.arith(op, x, y, dtype=dt, hint=op)
    if not dtypes.is_float(dt):
        return int_divide(b, x, y, dt, floor=mode == "floor")[0]
    q = b.arith("divide", x, y, dtype=dt, hint="quot")
    return b.ew("floor" if mode == "floor" else "trunc", q)


def int_divide(b, x, y, dt: str, floor: bool):
    """(quotient, remainder) of integers, floor or trunc rounded. `mod` may truncate (C) or
    floor (NumPy): the sign fix-up below is right under both, and the quotient divides an exact
    multiple, so every evaluator agrees."""
    x = b.cast(x, dt) if isinstance(x, T) else x
    y = b.cast(y, dt) if isinstance(y, T) else y
    r = b.ew("mod", x, y, dtype=dt, hint="rem")
    nonzero = b.ew("ne", r, 0, hint="rem_nz")
    if floor:     # the remainder takes the divisor's sign
        wrong = b.ew("ne", b.ew("lt", r, 0, hint="rem_neg"),
                     b.ew("lt", y, 0, hint="div_neg") if isinstance(y, T) else y < 0, hint="rem_sign")
        r = b.ew("where", b.ew("logical_and", nonzero, wrong, hint="fix"),
                 b.ew("add", r, y, dtype=dt, hint="rem_fixed"), r, dtype=dt, hint="rem_floor")
    else:         # the remainder takes the dividend's sign
        wrong = b.ew("ne", b.ew("lt", r, 0, hint="rem_neg"),
                     b.ew("lt", x, 0, hint="num_neg") if isinstance(x, T) else x < 0, hint="rem_sign")
        r = b.ew("where", b.ew("logical_and", nonzero, wrong, hint="fix"),
                 b.ew("subtract", r, y, dtype=dt, hint="rem_fixed"), r, dtype=dt, hint="rem_trunc")
    exact = b.ew("subtract", x, r, dtype=dt, hint="exact")
    return b.ew("floordiv", exact, y, dtype=dt, hint="quot"), r


@rule("aten.remainder", "aten.fmod", "aten.floor_divide")
def remainder(b, a):
    dt = b.out.dtype
    if not dtypes.is_float(dt):
        q, r = int_divide(b, a.self, a.other, dt, floor=b.op != "aten.fmod")
        return q if b.op == "aten.floor_divide" else r
    q = b.arith("divide", a.self, a.other, dtype=dt, hint="quot")
    q = b.ew("trunc" if b.op == "aten.fmod" else "floor", q)
    if b.op == "aten.floor_divide":
        return q
    qb = b.arith("multiply", q, a.other, dtype=dt, hint="qb")
    return b.arith("subtract", a.self, qb, dtype=dt)


@rule("aten.pow")
def pow_(b, a):
    x, e, dt = a.self, other_of(a), b.out.dtype
    if isinstance(x, T) and not isinstance(e, T):
        if e == 2:
            return b.arith("square", x, dtype=dt)
        if e == 1:
            return b.cast(x, dt)
    if isinstance(e, T) and not dtypes.is_float(dt) and dt != "bool":
        return int_pow(b, x, e, dt)
    return b.arith("pow", x, e, dtype=dt)


def int_pow(b, x, e: T, dt: str) -> T:
    """Integer pow with an exponent tensor that may hold negative values, as torch computes it:
    x ** -n is 1 for x = 1, +-1 for x = -1 (by n's parity), else 0; the power itself is taken of
    the exponent clamped at 0 (NumPy refuses negative integer powers)."""
    x = b.cast(x, dt) if isinstance(x, T) else x
    e = b.cast(e, dt)
    power = b.ew("pow", x, b.ew("maximum", e, 0, hint="exp"), dtype=dt, hint="power")
    if dt == "u8":              # no negative exponent
        return power
    odd = b.ew("ne", b.ew("mod", e, 2, hint="exp_mod2"), 0, hint="exp_odd")
    minus_one = b.ew("where", odd, -1, 1, dtype=dt, hint="minus_one_pow")
    if isinstance(x, T):
        inv = b.ew("where", b.ew("eq", x, -1, hint="is_minus_one"), minus_one, 0, dtype=dt,
                   hint="inv_pow")
        inv = b.ew("where", b.ew("eq", x, 1, hint="is_one"), 1, inv, dtype=dt, hint="inv")
    else:
        inv = 1 if x == 1 else (minus_one if x == -1 else 0)
    return b.ew("where", b.ew("lt", e, 0, hint="neg_exp"), inv, power, dtype=dt)


@rule(*COMPARE)
def compare(b, a):
    dt = promote(a.self, a.other)
    return b.ew(COMPARE[b.op], *[b.cast(v, dt) if isinstance(v, T) else v for v in (a.self, a.other)])


def _as_bool(b, x):
    return b.cast(x, "bool") if isinstance(x, T) else bool(x)


@rule(*LOGICAL)
def logical(b, a):
    """Bool results are logic; integer ones (bitwise_and/or/xor) work on the promoted bits."""
    op, dt = LOGICAL[b.op], b.out.dtype
    if dt != "bool":
        return b.arith(op.replace("logical", "bitwise"), a.self, a.other, dtype=dt)
    return b.ew(op, _as_bool(b, a.self), _as_bool(b, a.other))


@rule("aten.logical_not", "aten.bitwise_not")
def logical_not(b, a):
    if b.out.dtype != "bool":                     # bitwise_not of an integer
        return b.arith("bitwise_not", a.self, dtype=b.out.dtype)
    return b.ew("logical_not", _as_bool(b, a.self))


@rule(*SHIFT)
def shift(b, a):
    """x << n, x >> n (torch shifts integers only) for any count: see scalar_ops.py."""
    return b.arith(SHIFT[b.op], a.self, a.other, dtype=b.out.dtype)


@rule("aten.where")
def where(b, a):
    dt = b.out.dtype
    vals = [b.cast(v, dt) if isinstance(v, T) else v for v in (a.self, a.other)]
    return b.ew("where", _as_bool(b, a.condition), *vals, dtype=dt)


@rule("aten.masked_fill")
def masked_fill(b, a):
    dt = b.out.dtype
    value = b.cast(a.value, dt) if isinstance(a.value, T) else a.value
    return b.ew("where", _as_bool(b, a.mask), value, b.cast(a.self, dt), dtype=dt)


@rule("aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh")
def clamp(b, a):
    dt = b.out.dtype
    lo = a.get("min", a.get("min_val"))
    hi = a.get("max", a.get("max_val"))
    if b.op == "aten.clamp_max":
        lo, hi = None, a.max
    x = b.cast(a.self, dt)
    if lo is not None:
        x = b.arith("maximum", x, lo, dtype=dt, hint="lo")
    if hi is not None:
        x = b.arith("minimum", x, hi, dtype=dt, hint="hi")
    return x


@rule("aten.lerp")
def lerp(b, a):
    dt = b.out.dtype
    diff = b.arith("subtract", a.end, a.self, dtype=dt, hint="diff")
    step = b.arith("multiply", diff, a.weight, dtype=dt, hint="step")
    return b.arith("add", a.self, step, dtype=dt)


@rule("prims.fma")      # dynamo's addcmul_/addcdiv_ with a value (an optimizer's step)
def fma(b, a):
    return b.arith("fma", a.a, a.b, a.c, dtype=b.out.dtype)


@rule("aten.gelu")
def gelu(b, a):
    dt = b.out.dtype
    x = b.cast(a.self, dt)
    if a.get("approximate", "none") == "tanh":
        cube = b.ew("multiply", b.ew("square", x, hint="sq"), x, hint="cube")
        inner = b.ew("add", x, b.ew("multiply", cube, 0.044715, hint="c"), hint="inner")
        t = b.ew("tanh", b.ew("multiply", inner, math.sqrt(2.0 / math.pi), hint="scaled"))
    else:
        t = b.ew("erf", b.ew("multiply", x, 1.0 / math.sqrt(2.0), hint="scaled"))
    half = b.ew("multiply", x, 0.5, hint="half")
    return b.ew("multiply", half, b.ew("add", t, 1.0, hint="one_plus"))


@rule("aten.silu")
def silu(b, a):
    x = b.cast(a.self, b.out.dtype)
    return b.ew("multiply", x, b.ew("sigmoid", x))


@rule("aten.leaky_relu")
def leaky_relu(b, a):
    x = b.cast(a.self, b.out.dtype)
    slope = a.get("negative_slope", 0.01)
    pos = b.ew("gt", x, 0, hint="pos")
    return b.ew("where", pos, x, b.ew("multiply", x, slope, hint="neg"))


@rule("aten.elu")
def elu(b, a):
    x = b.cast(a.self, b.out.dtype)
    alpha, scale, in_scale = a.get("alpha", 1.0), a.get("scale", 1.0), a.get("input_scale", 1.0)
    em1 = b.ew("expm1", b.ew("multiply", x, in_scale, hint="xs"))
    neg = b.ew("multiply", em1, alpha * scale, hint="neg")
    pos = b.ew("multiply", x, scale, hint="posv") if scale != 1 else x
    return b.ew("where", b.ew("gt", x, 0, hint="pos"), pos, neg)


@rule("aten._to_copy", "aten.to", "aten.type_as", "aten._autocast_to_reduced_precision",
      "aten._autocast_to_full_precision", "aten.clone", "aten.contiguous", "aten.alias",
      "aten.detach", "aten.lift_fresh_copy", "aten.lift_fresh")
def convert(b, a):
    """Dtype conversions are `cast` nodes; same-dtype copies and aliases are the value itself."""
    return b.cast(a.self, b.out.dtype)


@rule("aten.copy")
def copy(b, a):
    """The functional form of `dst.copy_(src)` (what `torch.diff(x, n=0)` becomes): src's values
    in dst's shape (src broadcasts) and dtype; dst's own values are not read."""
    return b.bcast(b.cast(a.src, b.out.dtype), b.out.shape)
