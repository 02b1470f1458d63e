"""The flash-attention backward on Hopper's tensor cores, read in the machine code without a GPU.

Why: whether the three gradient kernels (dq, dk, dv: the Attention statement's sum form) run on
mma.sync is decided by the schedule, but whether they fit the registers is ptxas's call. At a
training shape (bf16, head dim 64, 256 positions, causal) each kernel holds HMMA instructions,
the one-score kernel (dv) spills nothing, and the two-score ones (dq, dk: a second product
g @ v^T) spill at most a few words, what the second score's fragments cost at 128 registers.
"""
import torch

from conftest import skip_unless_sass_readable

skip_unless_sass_readable()

import strata  # noqa: E402
from strata.core.context import Context  # noqa: E402
from strata.runtime.nvrtc import resource_usage  # noqa: E402
from strata.runtime.sass import sass  # noqa: E402
from strata.torch_compile import attention_op  # noqa: E402,F401

ARCH = "sm_90a"
ops = torch.ops.strata


def test_the_backward_kernels_run_on_tensor_cores_within_the_registers():
    q, k, v = (torch.randn(1, 4, 256, 64, dtype=torch.bfloat16) for _ in range(3))
    out, lse = ops.attention(q, k, v, None, 0.125, True)

    def fn(g, q, k, v, o, l):
        return ops.attention_backward(g, q, k, v, None, o, l, 0.125, True)
    prog = strata.compile(fn, (torch.randn_like(out), q, k, v, out, lse), device="sim",
                          ctx=Context(target=ARCH))
    fused = {t.name: t for t in prog.lowered.tile.kernels if t.mode == "attention"}
    assert len(fused) == 3 and all(dict(t.knobs)["INSTR"] == "mma" for t in fused.values())
    source = prog.source("cuda")
    code = sass(source, ARCH)
    use = resource_usage(source, ARCH)
    for name, t in fused.items():
        assert "HMMA" in code[name], f"{name} has no tensor-core instruction"
        spilled = use[name]["spill_stores"] + use[name]["spill_loads"]
        assert spilled <= (16 if t.attention.op.q2 is not None else 0), f"{name}: {use[name]}"
