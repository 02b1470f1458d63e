"""Two caches written at the same positions are one kernel (loop/scatter.py `siblings`): a decode
step's K and V writes of a layer, natively and in the simulator, as eager; not where one write's
rows read the other's cache (the second must see the first's update), nor at other positions."""
import pytest
import torch

import strata
from conftest import HAS_CC

DEVICES = ["sim", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CC, reason="no C compiler"))]


def kv_write(k_cache, v_cache, pos, k, v):
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v * 2)
    return (k_cache.sum(-1) + v_cache.sum(-1)).float()


def dependent_write(k_cache, v_cache, pos, k, v):
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, k_cache[:, :, :2] + v)      # reads the first write's rows
    return v_cache.sum(-1)


def other_positions(k_cache, v_cache, pos, k, v):
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos + 1, v)
    return v_cache.sum(-1)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    caches = [torch.randn(1, 3, 7, 5, generator=g) for _ in range(2)]
    return (*caches, torch.tensor([4, 1]), torch.randn(1, 3, 2, 5, generator=g),
            torch.randn(1, 3, 2, 5, generator=g))


def _writers(prog) -> list[tuple]:
    return [k.writes for k in prog.lowered.loop.kernels if any("cache" in w for w in k.writes)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn,together", [(kv_write, True), (dependent_write, False),
                                         (other_positions, False)])
def test_caches_written_at_the_same_positions_share_a_kernel(fn, together, device):
    inputs = _inputs()
    want_in = [t.clone() for t in inputs]
    want = fn(*want_in)
    got_in = [t.clone() for t in inputs]
    prog = strata.compile(fn, tuple(t.clone() for t in inputs), device=device)
    got = prog(*got_in)
    writers = _writers(prog)
    assert (writers == [("k_cache", "v_cache")]) == together, writers
    torch.testing.assert_close(got, want)
    for g, w in zip(got_in[:2], want_in[:2]):
        torch.testing.assert_close(g, w)

