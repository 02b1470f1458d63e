"""`strata.compile`: capture a function or module, lower it through every stage, and return a
callable `Program` that runs the generated kernels (on the simulator until the CUDA runtime
lands) and exposes the text of every stage."""
from __future__ import annotations

import numpy as np
import torch

from . import dtypes
from .context import Context
from .errors import DeviceUnavailable, InputMismatch, StrataError
from .pipeline import Lowered, STAGES, lower_torch_program

DEVICES = ("sim", "cuda")


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise StrataError(f"unknown device {device!r}; choose sim or cuda")
    if device == "cuda":
        raise DeviceUnavailable("--device cuda is not available yet: the CUDA runtime is not built; "
                                "use --device sim (the CPU simulator of the generated kernels)")


class Program:
    """A compiled program: call it like the original, print any stage with `ir(stage)`."""

    def __init__(self, lowered: Lowered, device: str = "sim"):
        self.lowered, self.device = lowered, device
        self.torch_program = lowered.torch

    def ir(self, stage: str) -> str:
        return self.lowered.text(stage)

    def source(self, target: str = "cuda") -> str:
        if target != "cuda":
            raise StrataError(f"unknown target {target!r}; only cuda exists so far")
        return self.lowered.cuda

    @property
    def kernels(self):
        return self.lowered.kernel.kernels

    def _check_inputs(self, inputs) -> dict[str, np.ndarray]:
        spec = self.torch_program.inputs
        if len(inputs) != len(spec):
            raise InputMismatch(f"expected {len(spec)} inputs ({', '.join(spec)}), got {len(inputs)}")
        out = {}
        for (name, ty), value in zip(spec.items(), inputs):
            if not isinstance(value, torch.Tensor):
                raise InputMismatch(f"input {name} must be a tensor, got {type(value).__name__}")
            got = (tuple(value.shape), dtypes.from_torch(value.dtype))
            if got != (tuple(ty.shape), ty.dtype):
                raise InputMismatch(f"input {name} has shape {got[0]} {got[1]}, the program was "
                                    f"compiled for {tuple(ty.shape)} {ty.dtype}")
            out[name] = to_numpy(value)
        return out

    def run_numpy(self, inputs) -> list[np.ndarray]:
        """Outputs as NumPy arrays (bf16 as float32 values), in program output order."""
        from .kernel.sim import simulate
        feed = self._check_inputs(inputs)
        feed.update({k: to_numpy(v) for k, v in self.torch_program.weights.items()})
        result = simulate(self.lowered.kernel, feed)
        return [result[o] if o in result else feed[o] for o in self.lowered.kernel.outputs]

    def __call__(self, *inputs):
        outs = []
        for name, arr in zip(self.lowered.kernel.outputs, self.run_numpy(inputs)):
            dt = self.lowered.kernel.buffer(name).dtype     # outputs and inputs are all buffers
            outs.append(torch.from_numpy(np.ascontiguousarray(arr)).to(dtypes.to_torch(dt)))
        spec = self.torch_program.out_spec
        if spec is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        return torch.utils._pytree.tree_unflatten(outs, spec)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def compile(fn, example_inputs, device: str = "sim", ctx: Context | None = None,
            until: str = "cuda") -> Program:
    """Capture `fn(*example_inputs)` (a function or nn.Module) and lower it to kernels."""
    from .frontend.capture import capture
    check_device(device)
    ctx = ctx or Context()
    torch_program = capture(fn, tuple(example_inputs))
    return Program(lower_torch_program(torch_program, ctx, until), device)


def compile_snippet(code: str, ctx: Context | None = None, until: str = "cuda"):
    """Parse and lower a `-c` snippet; returns (Program, example_inputs, snippet)."""
    from .frontend import capture_cache
    from .frontend.capture import capture_snippet
    from .frontend.snippet import parse_snippet
    import time
    ctx = ctx or Context()
    t0 = time.perf_counter()
    snippet = parse_snippet(code)
    torch_program = capture_cache.load(code)
    how = "capture (cached)"
    if torch_program is None:
        torch_program, how = capture_snippet(snippet), "capture (torch.export)"
        capture_cache.store(code, torch_program)
    ctx.log(f"{how:<28} {(time.perf_counter() - t0) * 1e3:8.2f} ms")
    return Program(lower_torch_program(torch_program, ctx, until)), snippet


__all__ = ["compile", "Program", "STAGES"]
