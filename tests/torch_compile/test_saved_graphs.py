"""torch.compile's programs kept across processes (strata/torch_compile/saved_graphs.py): a
graph compiled once is loaded, not captured or lowered, by a later process (dynamo reset stands in
for one), with the weights of that process's own call; anything the program depends on that
differs (options, a graph constant) compiles again, and so does an entry that cannot be read."""
import copy

import pytest
import torch
from torch import nn

from strata.core.context import Context
from strata.torch_compile import backend, saved_graphs

pytestmark = pytest.mark.usefixtures("cache_dir")


class Counter(nn.Module):
    """Updates a buffer in place (as a static KV cache's length does)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 7)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls.add_(1)
        return self.lin(x) * self.calls


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 33), nn.GELU(), nn.Linear(33, 5))


@pytest.fixture
def captures(monkeypatch):
    """How many graphs were captured (each capture is a compile that the cache did not spare)."""
    seen = []
    real = backend._capture
    monkeypatch.setattr(backend, "_capture", lambda *a: seen.append(1) or real(*a))
    return seen


def run(model, *inputs, options=None):
    """A new process's first call, as dynamo and the backend see it."""
    torch._dynamo.reset()
    with torch.no_grad():
        return torch.compile(model, backend="strata", options=options)(*inputs)


def test_a_new_process_loads_the_program_with_its_own_weights(captures):
    x = torch.randn(5, 16)
    first = mlp(0)
    torch.testing.assert_close(run(first, x), first(x).detach(), rtol=1e-5, atol=1e-5)
    assert len(captures) == 1
    other = mlp(1)                           # the same shapes, other values
    compiled = torch.compile(other, backend="strata")
    torch._dynamo.reset()
    with torch.no_grad():
        got = compiled(x)
        torch.testing.assert_close(got, other(x), rtol=1e-5, atol=1e-5)
        other[0].weight.add_(0.5)            # changed in place after the load: seen
        torch.testing.assert_close(compiled(x), other(x), rtol=1e-5, atol=1e-5)
    assert len(captures) == 1


def test_a_buffer_updated_in_place_is_written_by_the_loaded_program(captures):
    x = torch.randn(3, 12)
    a = Counter()
    b = copy.deepcopy(a)
    run(a, x)
    want = [b(x).detach() for _ in range(3)][1:]
    torch._dynamo.reset()
    compiled = torch.compile(a, backend="strata")
    with torch.no_grad():
        got = [compiled(x) for _ in range(2)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert a.calls.item() == 3 and len(captures) == 1


def test_other_options_compile_again(captures):
    x = torch.randn(5, 16)
    m = mlp(0)
    run(m, x)
    run(m, x, options={"verbosity": 1})          # the log's level is not the program
    assert len(captures) == 1
    run(m, x, options={"knobs": {"PACK": "call"}})
    assert len(captures) == 2


def test_a_graph_constant_is_part_of_the_key():
    class Scaled(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c = c                          # a plain tensor attribute: a get_attr node

        def forward(self, x):
            return x * self.c

    x = torch.randn(4)
    keys = {saved_graphs.key(torch.fx.symbolic_trace(Scaled(torch.tensor(c))), [x], [], {},
                             Context()) for c in (2.0, 2.0, 3.0)}
    assert len(keys) == 2 and None not in keys


def test_an_unreadable_entry_compiles_again(cache_dir, captures):
    x = torch.randn(5, 16)
    m = mlp(0)
    run(m, x)
    for entry in (cache_dir / "models").rglob("*.pkl"):
        entry.write_bytes(entry.read_bytes()[:100])
    torch.testing.assert_close(run(m, x), m(x).detach(), rtol=1e-5, atol=1e-5)
    assert len(captures) == 2
