"""The scalar operations every IR shares: one table with arity, NumPy semantics and C spelling.

Tensor IR `Elementwise`, Loop IR statements and Kernel IR expressions all name an op from this
table, so the NumPy evaluators, the simulator and the CUDA emitter cannot disagree about what
`maximum` or `round` means. Semantics follow PyTorch: NaN propagates through minimum/maximum,
round is half-to-even, integer division/modulo are only used on non-negative index arithmetic,
right shifts of signed integers are arithmetic.

C templates format their arguments as `{0}`, `{1}`, ... and work on the compute type (float for
f32/f16/bf16, double for f64, the integer type for integers); `st_*` helpers live in the CUDA
prelude and are overloaded for float and double. `{f}` is the float suffix: `f` in float, nothing
in double, so `exp{f}` prints `expf` or `exp` and `1.0{f}` prints `1.0f` or `1.0` (NVRTC would
otherwise run f64 through the single-precision functions).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import dtypes


def _torch_unary(name: str) -> Callable:
    def fn(x):
        import torch
        return getattr(torch, name)(torch.from_numpy(np.ascontiguousarray(x))).numpy()
    return fn


def _nan_max(a, b):
    return np.where(np.isnan(a) | np.isnan(b), np.nan, np.maximum(a, b)) if np.asarray(a).dtype.kind == "f" else np.maximum(a, b)


def _nan_min(a, b):
    return np.where(np.isnan(a) | np.isnan(b), np.nan, np.minimum(a, b)) if np.asarray(a).dtype.kind == "f" else np.minimum(a, b)


def _fma(a, b, c):
    """a * b + c rounded once (exact in float64 for float32 operands)."""
    return (np.asarray(a, np.float64) * b + c).astype(np.result_type(a, b, c))


def _sign(x):
    return np.sign(x)


@dataclass(frozen=True)
class ScalarOp:
    name: str
    arity: int
    numpy: Callable
    c_float: str            # C template for float operands ({f}: float suffix; "": ints only)
    c_int: str | None       # C template for integer/bool operands (None: floats only)
    result: str = "same"    # "same" | "bool" (comparisons, logical ops)


def _op(name, arity, fn, c_float, c_int=None, result="same"):
    return ScalarOp(name, arity, fn, c_float, c_int, result)


# the ops a CPU computes with a polynomial or a libm call (about ten multiply-adds each)
TRANSCENDENTAL = frozenset({"exp", "exp_shifted", "exp2", "expm1", "log", "log1p", "pow", "tanh",
                            "sigmoid", "erf", "sin", "cos"})
OPS: dict[str, ScalarOp] = {o.name: o for o in [
    # arithmetic
    _op("add", 2, np.add, "({0} + {1})", "({0} + {1})"),
    _op("subtract", 2, np.subtract, "({0} - {1})", "({0} - {1})"),
    _op("multiply", 2, np.multiply, "({0} * {1})", "({0} * {1})"),
    _op("divide", 2, np.divide, "({0} / {1})"),
    _op("floordiv", 2, np.floor_divide, "floor{f}({0} / {1})", "({0} / {1})"),
    _op("mod", 2, np.mod, "st_fmod({0}, {1})", "({0} % {1})"),
    _op("pow", 2, np.power, "pow{f}({0}, {1})"),
    _op("minimum", 2, _nan_min, "st_min({0}, {1})", "min({0}, {1})"),
    _op("maximum", 2, _nan_max, "st_max({0}, {1})", "max({0}, {1})"),
    _op("negative", 1, np.negative, "(-{0})", "(-{0})"),
    _op("abs", 1, np.abs, "fabs{f}({0})", "abs({0})"),
    _op("sign", 1, _sign, "st_sign({0})", "(({0} > 0) - ({0} < 0))"),
    _op("reciprocal", 1, lambda x: 1.0 / x, "(1.0{f} / {0})"),
    _op("square", 1, np.square, "({0} * {0})", "({0} * {0})"),
    _op("fma", 3, _fma, "fma{f}({0}, {1}, {2})"),
    # transcendental
    _op("exp", 1, np.exp, "exp{f}({0})"),
    # a softmax's exp(x - max): x <= 0, a result under 2^-126 is 0 (the C target's is cheaper)
    _op("exp_shifted", 1, lambda x: np.where(x < -87.33, np.zeros_like(x), np.exp(x)), "exp{f}({0})"),
    _op("exp2", 1, np.exp2, "exp2{f}({0})"),
    _op("log", 1, np.log, "log{f}({0})"),
    _op("log1p", 1, np.log1p, "log1p{f}({0})"),
    _op("expm1", 1, np.expm1, "expm1{f}({0})"),
    _op("sqrt", 1, np.sqrt, "sqrt{f}({0})"),
    _op("rsqrt", 1, lambda x: 1.0 / np.sqrt(x), "rsqrt{f}({0})"),
    _op("tanh", 1, np.tanh, "tanh{f}({0})"),
    _op("sigmoid", 1, lambda x: 1.0 / (1.0 + np.exp(-x)), "(1.0{f} / (1.0{f} + exp{f}(-{0})))"),
    _op("relu", 1, lambda x: np.where(x < 0, np.zeros_like(x), x), "({0} < 0.0{f} ? 0.0{f} : {0})",
        "({0} < 0 ? 0 : {0})"),
    _op("erf", 1, _torch_unary("erf"), "erf{f}({0})"),
    _op("sin", 1, np.sin, "sin{f}({0})"),
    _op("cos", 1, np.cos, "cos{f}({0})"),
    # rounding
    _op("floor", 1, np.floor, "floor{f}({0})", "{0}"),
    _op("ceil", 1, np.ceil, "ceil{f}({0})", "{0}"),
    _op("round", 1, np.rint, "rint{f}({0})", "{0}"),
    _op("trunc", 1, np.trunc, "trunc{f}({0})", "{0}"),
    # comparisons and logic (result bool)
    _op("eq", 2, np.equal, "({0} == {1})", "({0} == {1})", "bool"),
    _op("ne", 2, np.not_equal, "({0} != {1})", "({0} != {1})", "bool"),
    _op("lt", 2, np.less, "({0} < {1})", "({0} < {1})", "bool"),
    _op("le", 2, np.less_equal, "({0} <= {1})", "({0} <= {1})", "bool"),
    _op("gt", 2, np.greater, "({0} > {1})", "({0} > {1})", "bool"),
    _op("ge", 2, np.greater_equal, "({0} >= {1})", "({0} >= {1})", "bool"),
    _op("logical_and", 2, np.logical_and, "({0} && {1})", "({0} && {1})", "bool"),
    _op("logical_or", 2, np.logical_or, "({0} || {1})", "({0} || {1})", "bool"),
    _op("logical_xor", 2, np.logical_xor, "(bool({0}) != bool({1}))", "(bool({0}) != bool({1}))", "bool"),
    _op("logical_not", 1, np.logical_not, "(!{0})", "(!{0})", "bool"),
    _op("isnan", 1, np.isnan, "({0} != {0})", "false", "bool"),
    # integer bits (no float form); shifts take any count as torch and NumPy do: outside
    # [0, width) << gives 0 and >> the sign fill (C leaves those undefined: emitters guard them)
    _op("bitwise_and", 2, np.bitwise_and, "", "({0} & {1})"),
    _op("bitwise_or", 2, np.bitwise_or, "", "({0} | {1})"),
    _op("bitwise_xor", 2, np.bitwise_xor, "", "({0} ^ {1})"),
    _op("bitwise_not", 1, np.invert, "", "(~{0})"),
    _op("left_shift", 2, np.left_shift, "", "({0} << {1})"),
    _op("right_shift", 2, np.right_shift, "", "({0} >> {1})"),
    # conversion: the target dtype is the node's (Tensor IR) or the Cast's (expr.Cast); the
    # evaluators special-case it with expr.cast_values.
    _op("cast", 1, lambda x: x, "{0}", "{0}"),
    # selection: where(cond, a, b); result type is that of a/b
    _op("where", 3, np.where, "({0} ? {1} : {2})", "({0} ? {1} : {2})"),
]}

# Reductions: identity element and the binary op that combines two partial results.
REDUCE_COMBINE = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}


def reduce_identity(op: str, dtype: str):
    """The identity of reduction `op` for values of `dtype` (as a Python number)."""
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    floating = dtypes.is_float(dtype)
    if op in ("max", "argmax"):
        return float("-inf") if floating else (False if dtype == "bool" else int(np.iinfo(dtypes.to_numpy(dtype)).min))
    if op in ("min", "argmin"):
        return float("inf") if floating else (True if dtype == "bool" else int(np.iinfo(dtypes.to_numpy(dtype)).max))
    raise KeyError(op)


def get(name: str) -> ScalarOp:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown scalar op {name!r}") from None


def result_dtype(name: str, arg_dtypes: list[str]) -> str:
    """Dtype of op(name) applied to arguments of the given dtypes (where: of its value args)."""
    op = get(name)
    if op.result == "bool":
        return "bool"
    if name == "where":
        return arg_dtypes[1]
    return arg_dtypes[0]
