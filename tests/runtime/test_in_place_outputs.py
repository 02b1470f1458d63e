"""An output taken from an input before the program updates that input in place is the value
before the update, as in eager, natively on the CPU and in the simulator: `b = g.clone();
g.add_(1); return b` makes the Tensor IR output the input itself (clone is the value), so the
Loop IR gives it a buffer of its own, copied before any kernel writes the input
(loop/scatter.py `snapshots`). Neighbours: a view or detach (functionalized by torch.export: it
sees the update, as eager's alias does), a computed copy, the updated input itself, a KV-cache
write in place (index_copy_), 0-d and empty inputs."""
import pytest
import torch

import strata
from conftest import HAS_CC


def clone_then_update(g):
    b = g.clone()
    g.add_(1)
    return b


def detach_then_update(g):
    b = g.detach()
    g.add_(1)
    return b


def view_then_update(g):
    b = g.view(-1)
    g.add_(1)
    return b


def product_then_update(g):
    b = g * 1
    g.add_(1)
    return b


def updated_itself(g):
    g.add_(1)
    return g


def before_and_after(g):
    b = g.clone()
    g.mul_(3)
    return b, g, b + g


def two_inputs(g, h):
    b, c = g.clone(), h.clone()
    g.add_(h)
    h.sub_(1)
    return c, b, b


CASES = [clone_then_update, detach_then_update, view_then_update, product_then_update,
         updated_itself, before_and_after, two_inputs]
DEVICES = ["sim", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CC, reason="no C compiler"))]


def _leaves(x):
    return list(x) if isinstance(x, tuple) else [x]


def _same_as_eager(fn, inputs, device):
    mine, theirs = [x.clone() for x in inputs], [x.clone() for x in inputs]
    want = _leaves(fn(*theirs))
    prog = strata.compile(fn, [x.clone() for x in inputs], device=device)
    got = _leaves(prog(*mine))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w), (g, w)
    for m, t in zip(mine, theirs):                    # the inputs updated as eager updates them
        assert torch.equal(m, t), (m, t)
    return prog, got, mine


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3), (), (0,)], ids=["2x3", "0d", "empty"])
@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_outputs_and_inputs_updated_in_place_match_eager(fn, shape, device):
    n = fn.__code__.co_argcount
    inputs = [torch.arange(float(torch.Size(shape).numel())).reshape(shape) + 1 + k
              for k in range(n)]
    _same_as_eager(fn, inputs, device)


@pytest.mark.parametrize("device", DEVICES)
def test_a_copy_taken_before_an_update_is_its_own_buffer_written_first(device):
    x = torch.arange(6.0).reshape(2, 3)
    prog, (b, g, _), (given,) = _same_as_eager(before_and_after, [x], device)
    assert g.data_ptr() == given.data_ptr() and b.data_ptr() != given.data_ptr()
    lp = prog.lowered.loop
    assert lp.outputs[0] == "g_before" and lp.buffer("g_before").kind == "output"
    names = [k.name for k in lp.kernels]
    assert names[0] == "k_g_before" and names.index("k_g_before") < names.index("k_update_g")


@pytest.mark.parametrize("device", DEVICES)
def test_a_copy_of_a_cache_taken_before_an_index_copy_in_place(device):
    def write(cache, pos, v):
        before = cache.clone()
        cache.index_copy_(1, pos, v)
        return before, cache * 2

    cache, pos, v = torch.arange(24.0).reshape(2, 4, 3), torch.tensor([2]), -torch.ones(2, 1, 3)
    _same_as_eager(write, [cache, pos, v], device)


def adam_like(p, g, m):
    m.lerp_(g, 0.1)
    p.add_(m / (g.abs() + 1), alpha=-0.5)
    return p * 2


def transposed(g):
    g.copy_(g.t() * 2)
    return g.sum()


def old_read_later(g):
    b = g.clone()
    g.add_(1)
    return b.sum()


def centred(g):
    g.sub_(g.mean())
    return g * 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn, copied", [(adam_like, set()), (transposed, {"g"}),
                                        (old_read_later, {"g"}), (centred, None)],
                         ids=lambda x: getattr(x, "__name__", ""))
def test_a_new_value_computed_point_by_point_is_stored_in_the_input(fn, copied, device):
    """loop/scatter.py `stored_in_place`: the kernel computing an input's new value stores it in
    the input's buffer, no write-back copy (an optimizer's update), unless it reads the input at
    another point (a transpose) or a later kernel reads the old value."""
    inputs = [torch.arange(9.0).reshape(3, 3) / 4 + k for k in range(fn.__code__.co_argcount)]
    prog, _, _ = _same_as_eager(fn, inputs, device)
    updates = {k.name.removeprefix("k_update_") for k in prog.lowered.loop.kernels
               if k.name.startswith("k_update_")}
    assert copied is None or updates == copied
