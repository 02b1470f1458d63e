"""strata: PyTorch programs lowered through six printable stages into fused GPU kernels.

    prog = strata.compile(fn_or_module, example_inputs, device="sim")
    out = prog(*inputs)
    ids = strata.generate(hf_model, input_ids, max_new_tokens=16)  # KV-cache decoding
    strata.quantize(hf_model, "q8_0")               # linear weights as GGUF's Q8_0 blocks
    print(prog.ir("loop")); print(prog.source("cuda"))
    fast = torch.compile(model, backend="strata")   # torch_compile/backend.py

The names below are imported on first use (PEP 562), so that `strata --help` and `--version`
never import torch.
"""
import importlib
from importlib.metadata import entry_points

from .version import __version__

_LAZY = {"compile": "api", "Program": "api", "generate": "models.decode", "Context": "core.context",
         "StrataError": "core.errors", "quantize": "quant.formats", "set_threads": "runtime.threads"}
# what a @strata.kernel body calls (st.program_id, st.exp, st.shared, st.float32 ...)
_DSL = ("constexpr", "float32", "float64", "float16", "bfloat16", "int32", "int64", "exp", "exp2",
        "log", "log1p", "expm1", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "floor",
        "ceil", "abs", "relu", "isnan", "maximum", "minimum", "pow", "program_id", "thread_id",
        "num_programs", "block_dim", "where", "fma", "shared", "barrier", "shfl_xor", "shfl",
        "warp_sum", "warp_max", "warp_min", "atomic_add", "atomic_max", "atomic_min")
_LAZY.update(dict.fromkeys(_DSL, "dsl.lang"))
_LAZY["autotune"] = "dsl.autotune"
_LAZY["kernel"] = "dsl.kernel"          # @strata.kernel (Kernel IR is strata.kernel_ir)
_LAZY["custom_op"] = "dsl.custom_op"
_LAZY["check_example"] = "dsl.examples"


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'strata' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)


if not any(ep.value == "strata.torch_compile.backend:strata_backend"
           for ep in entry_points(group="torch_dynamo_backends")):
    from .torch_compile.backend import register as _register   # no entry point (or a stale one): register now
    _register()

__all__ = ["compile", "generate", "quantize", "set_threads", "Program", "Context", "StrataError",
           "__version__"]
