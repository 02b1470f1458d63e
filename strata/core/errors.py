"""The errors a user can hit. Each carries one clear sentence; the CLI prints it and exits non-zero
(a traceback only with --debug)."""


class StrataError(Exception):
    """Base of every user-facing error; str(e) is the sentence shown to the user."""
    exit_code = 1


class SnippetError(StrataError):
    """The -c snippet could not be parsed or evaluated."""


class UnsupportedOp(StrataError):
    """An aten op strata has no rule for: `unsupported op aten.X (at <user line>)`."""

    def __init__(self, op: str, where: str = ""):
        self.op, self.where = op, where
        super().__init__(f"unsupported op {op}" + (f" (at {where})" if where else ""))


class DataDependentShape(StrataError):
    """A shape or value that depends on the data (x[x > 0], nonzero, .item()): strata compiles
    programs whose shapes are known before they run."""

    def __init__(self, op="", where: str = ""):
        what = f"{op} " if op else ""
        super().__init__(f"{what}gives a shape or value that depends on the data (boolean-mask "
                         f"indexing, nonzero, unique, .item() ...)" + (f" at {where}" if where else "")
                         + "; strata compiles programs whose shapes are known before they run")


class KnobError(StrataError, ValueError):
    """A schedule knob strata cannot use: an unknown name, a value outside its rule in
    strata/core/knobs.py, or a pin one kernel cannot take. Also a ValueError, as the passes raised
    before."""


class UnsupportedDtype(StrataError, ValueError):
    """A tensor of a dtype strata has no type for (complex, float8, uint16 ...). Also a
    ValueError, which dtypes.from_torch raised before."""

    def __init__(self, dtype):
        self.dtype = dtype
        super().__init__(f"unsupported dtype {dtype}: strata compiles float32, float16, bfloat16, "
                         f"float64, integer and bool tensors")


class InputMismatch(StrataError):
    """A call-time argument has the wrong shape or dtype; the message names the argument."""


class CompileError(StrataError):
    """NVRTC rejected generated CUDA; the message names the kernel and carries the log."""


class KernelSyntaxError(StrataError):
    """A @strata.kernel body strata cannot compile: `file:line: why`."""


class SimError(StrataError):
    """The simulator caught an out-of-bounds access, a race or a divergent barrier (or a
    checked launch, `k[grid, block](..., checked=True)`, an out-of-bounds access)."""


class DeviceUnavailable(StrataError):
    """--device cuda asked for where no runtime / GPU exists."""
    exit_code = 2


class CudaError(StrataError):
    """A CUDA driver call failed; the message names the call and the error (for a launch also the
    kernel, grid and block)."""


class ModelError(StrataError):
    """A MODEL argument strata cannot use: an unknown name, a directory without config.json, a
    config that transformers cannot build."""


class CheckpointMismatch(ModelError):
    """A safetensors checkpoint disagrees with its config; the message names the tensor."""
