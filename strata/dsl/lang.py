"""The names a @strata.kernel body may call (`st.program_id`, `st.exp`, `st.shared` ...).

Why stubs: the body is never run by Python; the front end (dsl/frontend.py) reads its source and
recognises these names. Called outside a kernel, each says so in one sentence. The dtypes are
both annotations of st.shared arrays and casts (`st.float32(v)`).
"""
from __future__ import annotations

from ..core.errors import StrataError


class constexpr:
    """Annotation of a parameter whose value is compiled in (one specialisation per value)."""


class DType:
    def __init__(self, name: str, strata: str):
        self.name, self.strata = name, strata

    def __call__(self, value):
        _outside(self.name)

    def __repr__(self) -> str:
        return f"st.{self.name}"


float32, float64 = DType("float32", "f32"), DType("float64", "f64")
float16, bfloat16 = DType("float16", "f16"), DType("bfloat16", "bf16")
int32, int64 = DType("int32", "i32"), DType("int64", "i64")
DTYPES = {d.name: d for d in (float32, float64, float16, bfloat16, int32, int64)}

# st.NAME(x) -> the scalar op of scalar_ops.py
UNARY = {"exp": "exp", "exp2": "exp2", "log": "log", "log1p": "log1p", "expm1": "expm1",
         "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh", "sigmoid": "sigmoid", "erf": "erf",
         "sin": "sin", "cos": "cos", "floor": "floor", "ceil": "ceil", "abs": "abs",
         "relu": "relu", "isnan": "isnan"}
BINARY = {"maximum": "maximum", "minimum": "minimum", "pow": "pow"}
INDEX_FNS = ("program_id", "thread_id", "num_programs", "block_dim")
OTHER_FNS = ("where", "fma", "shared", "barrier", "shfl_xor", "shfl", "warp_sum", "warp_max",
             "warp_min", "atomic_add", "atomic_max", "atomic_min")


def _outside(name: str):
    raise StrataError(f"st.{name} can only be used inside a @strata.kernel function")


def _stub(name: str):
    def fn(*args, **kwargs):
        _outside(name)
    fn.__name__ = name
    return fn


for _name in (*UNARY, *BINARY, *INDEX_FNS, *OTHER_FNS):
    globals()[_name] = _stub(_name)
