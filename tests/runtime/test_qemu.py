"""cpu-neoverse and cpu-rvv programs built by Debian's cross gcc and run under qemu-user
(runtime/qemu.py), checked against eager; skipped with a sentence where a tool is missing."""
import shutil

import pytest
import torch

import strata
from strata.bench import check
from strata.cli import main
from strata.core.context import Context



def _target(name: str, machine: str):
    missing = shutil.which(f"qemu-{machine}") is None or shutil.which(f"{machine}-linux-gnu-gcc") is None
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=(
        f"needs qemu-user and gcc-{machine}-linux-gnu (apt-get install qemu-user "
        f"gcc-{machine}-linux-gnu)")))


FOREIGN = [_target("cpu-neoverse", "aarch64"), _target("cpu-rvv", "riscv64")]


@pytest.mark.parametrize("fn, shapes, dtype", [
    (lambda a, b: a @ b, ((37, 131), (131, 29)), torch.float32),            # odd and prime sizes
    (lambda a, b: a @ b, ((16, 64), (64, 48)), torch.bfloat16),
    (lambda x: torch.softmax(x, -1), ((5, 1000),), torch.float32),
    (lambda x, w: torch.nn.functional.rms_norm(x, (257,), w), ((3, 257), (257,)), torch.bfloat16),
    (lambda x: torch.nn.functional.silu(x.t()) * 2, ((33, 7),), torch.float32),   # transposed
    (lambda x: x.sum(), ((0, 4),), torch.float32),                            # empty
    (lambda x: (x * 3).exp(), ((),), torch.float32),                         # 0-d
])
@pytest.mark.parametrize("target", FOREIGN)
def test_foreign_code_under_qemu_matches_eager(target, fn, shapes, dtype):
    args = [torch.randn(s, dtype=dtype) for s in shapes]
    program = strata.compile(fn, args, ctx=Context(target=target))
    assert type(program.runtime).__name__ == "QemuProgram"
    assert check.verify(program, fn, [a.clone() for a in args]).passed


@pytest.mark.parametrize("target", FOREIGN)
def test_an_input_updated_in_place_comes_back(target):
    x = torch.randn(6)
    program = strata.compile(lambda t: t.mul_(2).add_(1), (x.clone(),), ctx=Context(target=target))
    before = x.clone()
    program(x)
    torch.testing.assert_close(x, before * 2 + 1)


@pytest.mark.parametrize("target", FOREIGN)
def test_strata_run_on_the_command_line(target, capsys):
    assert main(["run", "-c", "torch.nn.RMSNorm(64)(torch.randn(3, 64))", "--device", "cpu",
                 "--target", target]) == 0
    captured = capsys.readouterr()
    machine = {"cpu-neoverse": "aarch64", "cpu-rvv": "riscv64"}[target]
    assert "PASS" in captured.out and f"runs under qemu-{machine}" in captured.err
