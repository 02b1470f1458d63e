"""The done-when shapes of the spine: one kernel each, compiled to CUDA, without running them
(the simulator would need minutes for 117M elements)."""
import pytest
import torch

import strata
from conftest import compile_with_nvrtc

BIG = (1, 28, 2048, 2048)


@pytest.mark.slow
@pytest.mark.parametrize("name,fn", [
    ("rms_norm", torch.nn.RMSNorm(2048)),
    ("layer_norm", torch.nn.LayerNorm(2048)),
    ("softmax", torch.nn.Softmax(dim=-1)),
])
def test_big_norms_are_one_kernel(name, fn):
    x = torch.empty(BIG).normal_()
    prog = strata.compile(fn, (x,))
    assert len(prog.kernels) == 1, prog.ir("loop")
    compile_with_nvrtc(prog)
