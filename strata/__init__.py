"""strata: PyTorch programs lowered through six printable stages into fused GPU kernels.

    prog = strata.compile(fn_or_module, example_inputs, device="sim")
    out = prog(*inputs)
    print(prog.ir("loop")); print(prog.source("cuda"))
    fast = torch.compile(model, backend="strata")   # frontend/dynamo_backend.py
"""
from .api import Program, compile
from .context import Context
from .errors import StrataError
from .frontend.dynamo_backend import register as _register_dynamo_backend

_register_dynamo_backend()

__all__ = ["compile", "Program", "Context", "StrataError"]
