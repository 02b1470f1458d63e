"""cpu-neoverse programs built by the aarch64 cross gcc and run under qemu-user (runtime/qemu.py),
checked against eager; skipped with a sentence where either tool is missing."""
import shutil

import pytest
import torch

import strata
from strata import check
from strata.cli import main
from strata.context import Context

pytestmark = pytest.mark.skipif(
    shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-gcc") is None,
    reason="needs qemu-user and gcc-aarch64-linux-gnu (apt-get install qemu-user "
           "gcc-aarch64-linux-gnu)")

ARM = Context(target="cpu-neoverse")


@pytest.mark.parametrize("fn, shapes, dtype", [
    (lambda a, b: a @ b, ((37, 131), (131, 29)), torch.float32),            # odd and prime sizes
    (lambda a, b: a @ b, ((16, 64), (64, 48)), torch.bfloat16),
    (lambda x: torch.softmax(x, -1), ((5, 1000),), torch.float32),
    (lambda x, w: torch.nn.functional.rms_norm(x, (257,), w), ((3, 257), (257,)), torch.bfloat16),
    (lambda x: torch.nn.functional.silu(x.t()) * 2, ((33, 7),), torch.float32),   # transposed
    (lambda x: x.sum(), ((0, 4),), torch.float32),                            # empty
    (lambda x: (x * 3).exp(), ((),), torch.float32),                         # 0-d
])
def test_arm_code_under_qemu_matches_eager(fn, shapes, dtype):
    args = [torch.randn(s, dtype=dtype) for s in shapes]
    program = strata.compile(fn, args, ctx=ARM)
    assert type(program.runtime).__name__ == "QemuProgram"
    assert check.verify(program, fn, [a.clone() for a in args]).passed


def test_an_input_updated_in_place_comes_back():
    x = torch.randn(6)
    program = strata.compile(lambda t: t.mul_(2).add_(1), (x.clone(),), ctx=ARM)
    before = x.clone()
    program(x)
    torch.testing.assert_close(x, before * 2 + 1)


def test_strata_run_on_the_command_line(capsys):
    assert main(["run", "-c", "torch.nn.RMSNorm(64)(torch.randn(3, 64))", "--device", "cpu",
                 "--target", "cpu-neoverse"]) == 0
    captured = capsys.readouterr()
    assert "PASS" in captured.out and "runs under qemu-aarch64" in captured.err
