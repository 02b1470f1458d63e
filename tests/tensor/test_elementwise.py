"""Pointwise aten ops through Tensor IR vs torch eager, on odd / prime / size-1 shapes."""
import pytest
import torch
import torch.nn.functional as F

from tensor_helpers import check, check_cases, rnd

SHAPES = [(7,), (3, 1, 5)]
POS = dict(low=0.1, scale=3.0)          # domain of log / sqrt / rsqrt

UNARY = {
    "neg": (torch.neg, {}), "abs": (torch.abs, {}), "exp": (torch.exp, {}),
    "exp2": (torch.exp2, {}), "log": (torch.log, POS), "log1p": (torch.log1p, POS),
    "expm1": (torch.expm1, {}), "sqrt": (torch.sqrt, POS), "rsqrt": (torch.rsqrt, POS),
    "reciprocal": (torch.reciprocal, POS), "square": (torch.square, {}),
    "tanh": (torch.tanh, {}), "sigmoid": (torch.sigmoid, {}), "relu": (torch.relu, {}),
    "gelu": (F.gelu, {}), "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), {}),
    "silu": (F.silu, {}), "erf": (torch.erf, {}), "sin": (torch.sin, {}), "cos": (torch.cos, {}),
    "floor": (lambda x: torch.floor(x * 3), {}), "ceil": (lambda x: torch.ceil(x * 3), {}),
    "round": (lambda x: torch.round(x * 3), {}), "trunc": (lambda x: torch.trunc(x * 3), {}),
    "round_decimals": (lambda x: torch.round(x * 3, decimals=2), {}),
    "sign": (torch.sign, {}), "log2": (torch.log2, POS), "log10": (torch.log10, POS),
    "pow2": (lambda x: x ** 2, {}), "pow3": (lambda x: x ** 3, {}),
    "pow_half": (lambda x: x ** 0.5, POS), "rpow": (lambda x: 2 ** x, {}),
    "pow_tt": (lambda x: torch.pow(x, x), POS),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), {}), "elu": (F.elu, {}),
    "hardtanh": (F.hardtanh, {}), "relu6": (F.relu6, {}),
    "softplus": (F.softplus, {}), "hardswish": (F.hardswish, {}), "mish": (F.mish, {}),
    "hardsigmoid": (F.hardsigmoid, {}),
    "isnan": (lambda x: torch.isnan(torch.log(x)), {}),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unary(shape):
    check_cases({name: (fn, (rnd(*shape, **dom),)) for name, (fn, dom) in UNARY.items()})


BINARY = {
    "add": lambda x, y: x + y, "add_alpha": lambda x, y: torch.add(x, y, alpha=2.5),
    "sub": lambda x, y: x - y, "sub_alpha": lambda x, y: torch.sub(x, y, alpha=3),
    "mul": lambda x, y: x * y, "div": lambda x, y: x / y,
    "div_floor": lambda x, y: torch.div(x * 4, y, rounding_mode="floor"),
    "div_trunc": lambda x, y: torch.div(x * 4, y, rounding_mode="trunc"),
    "minimum": torch.minimum, "maximum": torch.maximum,
    "max_other": torch.max, "remainder": lambda x, y: torch.remainder(x * 4, y),
    "fmod": lambda x, y: torch.fmod(x * 4, y),
    "lerp_t": lambda x, y: torch.lerp(x, y, torch.sigmoid(y)),
    "lerp_s": lambda x, y: torch.lerp(x, y, 0.3),
    "where": lambda x, y: torch.where(x > y, x, y),
    "where_scalar": lambda x, y: torch.where(x > 0, x, 0.5),
    "masked_fill": lambda x, y: x.masked_fill(y > 0, -1.5),
    "masked_fill_t": lambda x, y: x.masked_fill(y > 0, torch.tensor(2.0)),
    "clamp": lambda x, y: x.clamp(-0.5, 0.5), "clamp_min": lambda x, y: x.clamp(min=0.1),
    "clamp_max": lambda x, y: x.clamp(max=0.2), "clamp_t": lambda x, y: torch.clamp(x, min=y),
    "add_scalar": lambda x, y: x + 3, "rsub": lambda x, y: 1 - x, "scalar_div": lambda x, y: 2 / y,
    "addcmul": lambda x, y: torch.addcmul(x, x, y, value=0.5),
    "xlogy": lambda x, y: torch.xlogy(x, y.abs() + 0.1),
    "logaddexp": torch.logaddexp,
}
PAIRS = [((5,), (5,)), ((3, 1, 5), (4, 1)), ((1, 7), (6, 1))]


def _pair(shapes):
    x, y = rnd(*shapes[0]), rnd(*shapes[1], low=0.5)
    return x, torch.where(torch.rand(y.shape) < 0.5, -y, y)   # both signs, away from zero


@pytest.mark.parametrize("shapes", PAIRS, ids=str)
def test_binary(shapes):
    check_cases({name: (fn, _pair(shapes)) for name, fn in BINARY.items()})


COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]


def _compare_case(fn):
    x, y = rnd(3, 5, scale=3), rnd(5)
    y = torch.where(torch.rand(5) < 0.3, x[0], y)              # some equal elements
    return lambda x, y: (fn(x, y), fn(x, 0.25), fn(x.int(), 0.5), fn(x.int(), y.int())), (x, y)


def _logical_case(fn):
    return lambda x, y: (fn(x > 0, y > 0), fn(x, y)), (rnd(4, 3), rnd(3))


def test_compare_and_logic():
    cases = {op: _compare_case(getattr(torch, op)) for op in COMPARE}
    cases.update({op: _logical_case(getattr(torch, op))
                  for op in ["logical_and", "logical_or", "logical_xor"]})
    cases["not"] = (lambda x, y: (~(x > 0), torch.logical_not(x), (x > 0) | (y > 0),
                                  (x > 0) & (y < 0), (x > 0) ^ (y > 0)), (rnd(4, 3), rnd(3)))
    check_cases(cases)


def test_promotion():
    i = torch.randint(-5, 6, (3, 4))
    j = torch.randint(1, 6, (4,))
    x = rnd(3, 4)
    check(lambda i, j, x: (i + x, i / j, i + 2.5, i * 2, (i > 0) + 1, i.float().mean(), x * True,
                           torch.exp(i), i.sum(), (i > 0).sum(), i - j, -i, i.abs(), i ** 2),
          i, j, x)


def test_casts():
    x = rnd(5, 3, scale=4.0)
    check(lambda x: (x.half(), x.to(torch.bfloat16).float(), x.int(), x.long().float(),
                     (x > 0).float(), x.bool(), x.type_as(torch.zeros(1, dtype=torch.float16)),
                     x.to(torch.float64).float()), x)


def test_integer_division():
    i = torch.randint(-9, 10, (4, 6))
    j = torch.randint(1, 5, (6,)) * torch.where(torch.rand(6) < 0.5, -1, 1)
    check_cases({"int": (lambda i, j: (i % j, i % 4, i // j, torch.div(i, j, rounding_mode="trunc"),
                                        torch.div(i, j, rounding_mode="floor"), torch.fmod(i, j),
                                        torch.floor_divide(i, 3), torch.remainder(i, -3)), (i, j)),
                 "float": (lambda x: (x // 0.3, x % 0.7, torch.floor_divide(x, -0.4)), (rnd(5) * 3,))})
