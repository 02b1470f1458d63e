"""strata: PyTorch programs lowered through six printable stages into fused GPU kernels.

    prog = strata.compile(fn_or_module, example_inputs, device="sim")
    out = prog(*inputs)
    print(prog.ir("loop")); print(prog.source("cuda"))
"""
from .api import Program, compile
from .context import Context
from .errors import StrataError

__all__ = ["compile", "Program", "Context", "StrataError"]
