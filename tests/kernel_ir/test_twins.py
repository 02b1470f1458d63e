"""Twins (kernel_ir/twins.py): kernels alike but for their names are lowered once and renamed; the
renamed kernel reads and writes its own buffers (checked on the simulator, which runs every
kernel's Kernel IR, and natively, where the C target calls the first one's function)."""
import pytest
import torch
from torch import nn

import strata
from conftest import HAS_CC


class Stack(nn.Module):
    """Four tanh(linear) layers: the middle two read and write temps alike (twins); the first
    reads the input, the last writes the output."""

    def __init__(self, width: int = 24):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


@pytest.mark.parametrize("device", ["sim", pytest.param("cpu", marks=pytest.mark.skipif(
    not HAS_CC, reason="no C compiler: the CPU target cannot be built here (install gcc)"))])
def test_a_twin_computes_with_its_own_buffers(device):
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.randn(5, 24)
    prog = strata.compile(model, (x,), device=device)
    program = prog.lowered.kernel
    assert len(program.twins) >= 1
    by_name = {k.name: k for k in program.kernels}
    for name, first in program.twins.items():
        a, b = by_name[first], by_name[name]
        assert a.params != b.params and [p.dtype for p in a.params] == [p.dtype for p in b.params]
        text = str(b)
        for pa, pb in zip(a.params, b.params):
            text = text.replace(pb.name, pa.name)
        assert text.replace(b.name, a.name) == str(a)
    torch.testing.assert_close(prog(x), model(x), rtol=1e-5, atol=1e-5)
    if device == "cpu":
        assert "the same code as" in prog.source("c")


def test_kernels_of_different_shapes_are_not_twins():
    class Widening(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 16), nn.Linear(16, 16),
                                         nn.Linear(16, 8)])

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x))
            return x
    model, x = Widening().eval(), torch.randn(3, 8)
    prog = strata.compile(model, (x,), device="sim")
    assert not prog.lowered.kernel.twins
    torch.testing.assert_close(prog(x), model(x), rtol=1e-5, atol=1e-5)
