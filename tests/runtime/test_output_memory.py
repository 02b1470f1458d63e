"""A native program's large output goes into the memory of the last call's once nothing but the
program holds it (runtime/native.py `_output`): no page faults for a training step's gradients,
which zero_grad drops before the next backward. Never while the caller holds that output, a view
of it or its storage; the values are always the new call's; small outputs are left to torch."""
import pytest
import torch

import strata
from conftest import HAS_CC

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the native CPU runtime "
                                "cannot be built here; install gcc to run these tests")


def affine(x):
    return x * 2 + 1, x.sum(0)


@pytest.fixture(scope="module")
def program():
    x = torch.randn(509, 1031)           # 2 MiB, prime sizes: the first output is kept
    return strata.compile(affine, [x], device="cpu")


def _check(out, x):
    big, small = out
    torch.testing.assert_close(big, x * 2 + 1)
    torch.testing.assert_close(small, x.sum(0), rtol=1e-5, atol=1e-4)


def test_dropped_output_memory_is_taken_again(program):
    x = torch.randn(509, 1031)
    first = program(x)
    _check(first, x)
    at = first[0].data_ptr()
    del first
    y = torch.randn(509, 1031)
    second = program(y)
    _check(second, y)
    assert second[0].data_ptr() == at
    assert second[0].is_contiguous() and second[0].storage_offset() == 0


@pytest.mark.parametrize("hold", ["tensor", "view", "storage"])
def test_held_output_is_never_overwritten(program, hold):
    x, y = torch.randn(509, 1031), torch.randn(509, 1031)
    first = program(x)
    held = {"tensor": lambda t: t, "view": lambda t: t[3:5, ::7],
            "storage": lambda t: t.untyped_storage()}[hold](first[0])
    want = first[0].clone()
    at = first[0].data_ptr()
    del first
    second = program(y)
    _check(second, y)
    assert second[0].data_ptr() != at
    now = held if hold == "tensor" else torch.empty(0).set_(held, 0, want.shape) \
        if hold == "storage" else held
    assert torch.equal(now, want if hold != "view" else want[3:5, ::7])


def test_gradients_of_a_compiled_training_step_match_eager():
    """The real user: a backward's weight gradients (2 MiB each) land in the memory of the last
    step's, which zero_grad dropped; each step's gradients and parameters match eager's."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(1031, 509), torch.nn.Tanh(), torch.nn.Linear(509, 3))
    mine = torch.nn.Sequential(*(torch.nn.Linear(l.in_features, l.out_features) if
                                 isinstance(l, torch.nn.Linear) else l for l in ref))
    mine.load_state_dict(ref.state_dict())
    torch._dynamo.reset()          # nn.Sequential's code may be marked dynamic by an earlier test
    compiled = torch.compile(mine, backend="strata", dynamic=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, mine)]
    addresses = []
    for step in range(3):
        x = torch.randn(7, 1031)
        for model in (ref, compiled):
            model(x).square().mean().backward()
        addresses.append(mine[0].weight.grad.data_ptr())
        for a, b in zip(ref.parameters(), mine.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    assert addresses[1] == addresses[2]
    for a, b in zip(ref.parameters(), mine.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
