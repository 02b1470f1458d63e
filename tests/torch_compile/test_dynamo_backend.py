"""torch.compile(..., backend="strata"): dynamo's graphs run as strata Programs on the simulator
and match eager in float64; unsupported ops raise a strata error naming them (eager only on an
explicit opt-in, with a warning); the backend is found with and without `import strata`."""
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import strata  # noqa: F401  (registers the backend when no entry point is installed)
from strata.bench import check
from strata.core.errors import StrataError, UnsupportedOp
from strata.torch_compile import backend as dynamo_backend, buckets
from strata.torch_compile.backend import StrataFallbackWarning, UnsupportedGraph

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    """A clean dynamo cache per test, no fallback from the environment, and a record of every
    graph strata compiled (so a test can tell strata ran it, not eager)."""
    torch._dynamo.reset()
    # programs another test compiled (kept while not yet collected) are not this test's
    monkeypatch.setattr(dynamo_backend, "_SHARED", weakref.WeakValueDictionary())
    monkeypatch.delenv("STRATA_FALLBACK", raising=False)
    compiled = []
    real = dynamo_backend._compile

    def spy(*args, **kw):
        out = real(*args, **kw)
        compiled.append(out)
        return out

    monkeypatch.setattr(dynamo_backend, "_compile", spy)
    yield compiled
    torch._dynamo.reset()


def _assert_matches(name, got, fn, inputs, contraction):
    ref = check.eager_reference(fn, inputs)
    flat, _ = torch.utils._pytree.tree_flatten(got)
    assert len(flat) == len(ref)
    for i, (g, r) in enumerate(zip(flat, ref)):
        dt = {torch.float32: "f32"}[g.dtype]
        res = check.compare(f"{name}[{i}]", dt, g.detach().numpy(), r, check.tolerance(dt, contraction))
        assert res.passed, f"{name}[{i}]: rel err {res.rel:.3g}, max abs {res.max_abs:.3g} (tol {res.tol})"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(1 + 0.2 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def test_mlp_matches_eager(_fresh_dynamo):
    model = MLP().eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        out = torch.compile(model, backend="strata")(x)
    assert len(_fresh_dynamo) == 1 and _fresh_dynamo[0].program is not None
    tp = _fresh_dynamo[0].program.torch_program      # the parameters are weights, not inputs
    assert tp.input_names == ["x"]
    assert list(tp.weights) == ["p_fc1_weight", "p_fc1_bias", "p_fc2_weight", "p_fc2_bias"]
    assert isinstance(out, torch.Tensor) and out.shape == (4, 16)
    _assert_matches("mlp", out, model, (x,), contraction=True)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 96)
        self.register_buffer("scale", torch.rand(96) + 0.5)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_weights_are_packed_once_and_again_when_changed(_fresh_dynamo, monkeypatch):
    """A module's parameters and buffers are the program's weights, packed once at load (the CPU
    runtime's once kernels); a weight changed between calls (in place, by load_state_dict, by an
    optimizer step, or replaced) is packed again, so no call runs on stale weights."""
    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(8, 64)
    run = torch.compile(model, backend="strata")
    with torch.no_grad():
        _assert_matches("first call", run(x), model, (x,), contraction=True)
        (graph,) = _fresh_dynamo
        assert graph.program.torch_program.input_names == ["x"]
        assert sorted(graph.program.torch_program.weights) == ["b_scale", "p_lin_bias", "p_lin_weight"]
        runtime = graph.program.runtime
        assert runtime._once                    # the linear's weight panel, packed at load
        packs, real = [], runtime._run_once     # the once kernels each change runs again
        monkeypatch.setattr(runtime, "_run_once", lambda again=None: (packs.append(again), real(again)))
        _assert_matches("same weights", run(x), model, (x,), contraction=True)
        assert packs == []
        model.lin.weight.add_(0.5)              # same storage, a new version
        _assert_matches("weight.add_", run(x), model, (x,), contraction=True)
        model.scale.mul_(2)
        _assert_matches("buffer.mul_", run(x), model, (x,), contraction=True)
        model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
        _assert_matches("load_state_dict", run(x), model, (x,), contraction=True)
        assert packs == [[0], [], [0]]          # the weight's panel; none for the buffer
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    with torch.no_grad():
        _assert_matches("optimizer step", run(x), model, (x,), contraction=True)
        model.lin.weight = nn.Parameter(torch.randn(96, 64))     # another storage
        _assert_matches("new parameter", run(x), model, (x,), contraction=True)


def test_rms_norm_matches_eager_with_options(_fresh_dynamo):
    """Where autograd is on (the weight requires grad) forward and backward both run on the
    simulator; the weight's gradient is eager's."""
    model = RMSNorm(48)
    x = torch.randn(2, 6, 48)
    out = torch.compile(model, backend="strata", options={"device": "sim", "knobs": {}})(x)
    assert len(_fresh_dynamo) == 2 and all(c.device == "sim" for c in _fresh_dynamo)
    _assert_matches("rmsnorm", out.detach(), model, (x,), contraction=False)
    out.sum().backward()
    got = model.weight.grad.clone()
    model.weight.grad = None
    model(x).sum().backward()
    assert torch.allclose(got, model.weight.grad, rtol=1e-5, atol=1e-6)


def test_graph_break_compiles_each_graph(_fresh_dynamo):
    def fn(x, w):
        h = torch.tanh(x @ w)
        torch._dynamo.graph_break()
        return h.sum(-1), torch.sigmoid(h) * x
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    out = torch.compile(fn, backend="strata")(x, w)
    assert len(_fresh_dynamo) == 2 and all(c.program is not None for c in _fresh_dynamo)
    assert isinstance(out, tuple) and len(out) == 2
    _assert_matches("graph break", out, fn, (x, w), contraction=True)


@pytest.fixture
def poisoned_padding(monkeypatch):
    """Padding that holds NaN: a bucketed program that read it would return NaN."""
    monkeypatch.setattr(buckets, "FILL", float("nan"))


def test_dynamic_shapes_share_a_program_per_bucket(_fresh_dynamo, poisoned_padding):
    """After a recompile dynamo hands over a shape-dynamic graph; strata runs it padded to a
    bucket of sizes (a mean over the padded axis divides by the call's count)."""
    def fn(x):
        return torch.relu(x) * 2 - x.mean(0)
    compiled = torch.compile(fn, backend="strata")
    for rows, programs in ((3, 1), (5, 2), (7, 2), (64, 2), (65, 3)):
        x = torch.randn(rows, 4)
        _assert_matches(f"rows={rows}", compiled(x), fn, (x,), contraction=False)
        assert len(_fresh_dynamo) == programs, rows
    assert _fresh_dynamo[0].slots == [0] and _fresh_dynamo[-1].slots == [0, 1]   # the size last


def _decode_step(q, k_past, v_past, k_new, v_new, sdpa):
    """One decode step under a dynamic KV cache: the cache grows by cat, attention reads it."""
    k, v = torch.cat([k_past, k_new], dim=-2), torch.cat([v_past, v_new], dim=-2)
    if sdpa:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    else:
        out = torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1) @ v
    return out, k, v


@pytest.mark.parametrize("sdpa", [False, True])
def test_a_growing_kv_cache_runs_one_program_per_bucket(sdpa, _fresh_dynamo, poisoned_padding,
                                                         monkeypatch):
    """The padding is never read: keys past the call's length are masked out of the softmax,
    read as 0 by the products, and the new row lands at the call's length, not the bucket's."""
    monkeypatch.setattr(buckets, "MIN", 8)
    compiled = torch.compile(lambda *a: _decode_step(*a, sdpa=sdpa), backend="strata")
    torch.manual_seed(0)
    for length in range(3, 20):
        args = (torch.randn(1, 2, 1, 16), torch.randn(1, 2, length, 16), torch.randn(1, 2, length, 16),
                torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16))
        got, want = compiled(*args), _decode_step(*args, sdpa=sdpa)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.is_contiguous()
            assert torch.allclose(g, w, rtol=1e-5, atol=1e-6), length
    assert len(_fresh_dynamo) == 4        # length 3 as it is, then buckets of 8, 16 and 32


def test_a_graph_that_cannot_run_padded_gets_a_program_per_shape(_fresh_dynamo, capfd):
    """flip moves the padding into the result: refused, with the reason at verbosity 1."""
    def fn(x):
        return torch.flip(x, [0]) * 2
    compiled = torch.compile(fn, backend="strata", options={"verbosity": 1})
    for rows in (3, 5, 7):
        x = torch.randn(rows, 4)
        assert torch.equal(compiled(x), fn(x))
    assert len(_fresh_dynamo) == 3
    assert "a program per size for this shape-dynamic graph: flip" in capfd.readouterr().err


def test_many_shapes_of_one_graph_are_said_once(_fresh_dynamo, monkeypatch):
    monkeypatch.setattr(dynamo_backend, "MANY_SHAPES", 3)
    compiled = torch.compile(lambda x: torch.flip(x, [0]) * 2, backend="strata")
    with pytest.warns(dynamo_backend.StrataManyShapesWarning, match="cache_implementation='static'") as w:
        for rows in (2, 3, 4, 5, 6, 7):
            compiled(torch.randn(rows, 4))
    assert len([m for m in w if m.category is dynamo_backend.StrataManyShapesWarning]) == 1


def test_output_structure_aliases_and_constants():
    """The backend on a hand-made graph: an input returned as is stays that very tensor, a
    constant stays a constant, a value returned twice is computed once."""
    def fn(x, y):
        r = torch.relu(x + y)
        return x, (r, 3), [r, y * 2]
    gm = torch.fx.symbolic_trace(fn)
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    run = dynamo_backend.strata_backend(gm, [x, y])
    out = run(x, y)
    assert out[0] is x and out[1][1] == 3 and isinstance(out[2], list)
    (entry,) = run.entries.values()
    assert len(entry.program.torch_program.outputs) == 2
    _assert_matches("structure", [out[1][0], out[2][0], out[2][1]],
                    lambda a, b: (torch.relu(a + b), torch.relu(a + b), b * 2), (x, y), False)


def _kth_plus_one(x):
    return torch.kthvalue(x, 2, dim=-1).values + 1


def test_unsupported_op_raises_a_clear_error():
    x = torch.randn(4, 8)
    with pytest.raises(Exception) as info:
        torch.compile(_kth_plus_one, backend="strata")(x)
    err = info.value
    inner = getattr(err, "inner_exception", err)
    assert isinstance(inner, UnsupportedGraph) and isinstance(inner, UnsupportedOp)
    assert inner.ops == ["aten.kthvalue"]
    assert "unsupported op aten.kthvalue (at " in str(err) and "test_dynamo_backend.py" in str(err)
    assert "torch.kthvalue(x, 2, dim=-1)" in str(err) and "fallback" in str(err)


@pytest.mark.parametrize("how", ["option", "env"])
def test_fallback_opt_in_warns_and_matches_eager(how, monkeypatch, _fresh_dynamo):
    kw = {"options": {"fallback": True}} if how == "option" else {}
    if how == "env":
        monkeypatch.setenv("STRATA_FALLBACK", "1")
    x = torch.randn(4, 8)
    with pytest.warns(StrataFallbackWarning, match=r"eagerly .*unsupported op aten\.kthvalue"):
        out = torch.compile(_kth_plus_one, backend="strata", **kw)(x)
    assert _fresh_dynamo == []
    assert torch.equal(out, _kth_plus_one(x))


def test_in_place_updates_of_inputs_and_buffers_are_written_in_place(_fresh_dynamo):
    """An input the graph updates in place is the caller's tensor, updated; a buffer updated in
    place (a step counter) is an input of the program, not a packed weight."""
    def fn(x):
        x.mul_(2)
        return x + 1
    x = torch.randn(7)
    want = x * 2
    out = torch.compile(fn, backend="strata")(x)
    assert torch.equal(x, want) and torch.allclose(out, want + 1, rtol=1e-6, atol=0)

    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 3)
            self.register_buffer("steps", torch.zeros(()))

        def forward(self, x):
            self.steps.add_(1)
            return self.lin(x) * self.steps

    torch.manual_seed(0)
    model, x = Counted(), torch.randn(2, 5)
    run = torch.compile(model, backend="strata")
    with torch.no_grad():
        want = model.lin(x)
        for k in (1, 2, 3):
            assert torch.allclose(run(x), want * k, rtol=1e-5, atol=1e-6)
            assert model.steps.item() == k
    tp = _fresh_dynamo[-1].program.torch_program
    assert sorted(tp.input_names) == ["steps", "x"] and "b_steps" not in tp.weights


def test_bad_options_are_clear_errors():
    with pytest.raises(StrataError, match="unknown strata option devic; known: device"):
        dynamo_backend.options_of({"devic": "sim"})
    with pytest.raises(StrataError, match="unknown device 'gpu'"):
        dynamo_backend.options_of({"device": "gpu"})
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    with pytest.raises(StrataError, match="device cuda needs every input of the graph on the GPU"):
        dynamo_backend.strata_backend(gm, [torch.randn(2)], options={"device": "cuda"})


def test_tiny_causal_lm_logits_match_eager(_fresh_dynamo):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tests" / "models"))
    from model_helpers import hf_model

    from strata.models.wrappers import CausalLMLogits
    model = hf_model("llama")
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    with torch.no_grad():
        logits = torch.compile(model, backend="strata")(ids, use_cache=False).logits
    assert len(_fresh_dynamo) >= 1 and all(c.program is not None for c in _fresh_dynamo)
    _assert_matches("logits", logits, CausalLMLogits(model), (ids,), contraction=True)


@pytest.mark.parametrize("cache,attention", [("static", "eager"), ("dynamic", "eager"),
                                             ("dynamic", "sdpa")])
def test_generate_with_either_cache_compiles_nothing_the_second_time(cache, attention, _fresh_dynamo,
                                                                    monkeypatch):
    """transformers' recommended path: model.forward compiled, then generate. The static cache is
    written in place (its zeros made in the first graph, its rows and length counters updated
    in place after); under the dynamic cache the later, shape-dynamic graph runs one program per
    bucket of cache lengths (buckets.py; here buckets of 8, so 12 tokens take 2). Greedy ids equal
    eager's; a second generate compiles nothing, nor does a third prompt length, under either
    cache."""
    pytest.importorskip("transformers")
    monkeypatch.setattr(buckets, "MIN", 8)
    monkeypatch.setattr(buckets, "FILL", float("nan"))
    sys.path.insert(0, str(REPO / "tests" / "models"))
    from model_helpers import hf_model
    model = hf_model("llama", num_hidden_layers=1)     # two layers: the logits test above
    model.set_attn_implementation(attention)
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    kw = dict(max_new_tokens=12, do_sample=False, cache_implementation=cache)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        eager = model.forward
        model.forward = compiled = torch.compile(model.forward, backend="strata")
        assert torch.equal(model.generate(ids, **kw), want)
        first = len(_fresh_dynamo)
        assert all(c.program is not None for c in _fresh_dynamo)
        # prefill and the first step as they are, then (dynamic) lengths 6..16 in 2 buckets
        assert first == (2 if cache == "static" else 4)
        assert torch.equal(model.generate(ids, **kw), want)
        assert len(_fresh_dynamo) == first
        # other prompt lengths: the prefill graph turns shape-dynamic and takes a bucket of its
        # own (its last row read at the call's end; the static cache, whose length follows the
        # prompt's, written at the call's positions and back into the caller's tensor); a third
        # length in that bucket compiles nothing
        for length, more in ((7, True), (6, False)):
            ids = torch.randint(0, model.config.vocab_size, (1, length))
            model.forward = eager
            want = model.generate(ids, **kw)
            model.forward = compiled
            before = len(_fresh_dynamo)
            assert torch.equal(model.generate(ids, **kw), want)
            assert (len(_fresh_dynamo) > before) == more


def test_generate_under_dynamic_true_buckets_and_reads_module_floats(_fresh_dynamo, monkeypatch):
    """torch.compile(..., dynamic=True): dynamo passes the modules' floats (RMSNorm's eps, the
    rotary scaling, the embedding's norm_type) as 0-d tensors read by .item(), which strata reads
    as constants (floats.py), and every size is symbolic from the first call: the prefill and the
    decode steps each run one program per bucket."""
    pytest.importorskip("transformers")
    monkeypatch.setattr(buckets, "MIN", 8)
    monkeypatch.setattr(buckets, "FILL", float("nan"))
    sys.path.insert(0, str(REPO / "tests" / "models"))
    from model_helpers import hf_model
    model = hf_model("llama", num_hidden_layers=1)
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    kw = dict(max_new_tokens=12, do_sample=False)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.forward = torch.compile(model.forward, backend="strata", dynamic=True)
        assert torch.equal(model.generate(ids, **kw), want)
        first = len(_fresh_dynamo)
        assert first == 3                     # the prefill's bucket, the decode's two (8, 16)
        assert torch.equal(model.generate(ids, **kw), want)
        assert len(_fresh_dynamo) == first


def test_a_float_attribute_changed_between_calls_is_read_anew(_fresh_dynamo):
    """A float dynamo does not specialise is a constant of each program strata makes: a call
    with another value takes a program of its own, never the old value's."""
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.scale = nn.Linear(6, 3), 0.5

        def forward(self, x):
            return self.lin(x) * self.scale + self.scale

    m, x = Scaled(), torch.randn(4, 6)
    compiled = torch.compile(m, backend="strata", dynamic=True)
    with torch.no_grad():
        for scale in (0.5, 2.0, 0.5):
            m.scale = scale
            torch.testing.assert_close(compiled(x), m.lin(x) * scale + scale, rtol=1e-5, atol=1e-5)
    assert len(_fresh_dynamo) == 2


def test_one_graph_called_with_other_modules_weights_runs_each_ones(_fresh_dynamo, monkeypatch):
    """dynamo traces nn.Linear.forward once for every Linear (parameters are inputs it does not
    guard on), as regional compilation of a repeated block does: each module's weights get a
    program of their own, made once, so alternating calls pack nothing; an in-place update of
    one module's weight packs that one again."""
    from strata.api import Program
    torch.manual_seed(0)
    one, two, x = nn.Linear(8, 4), nn.Linear(8, 4), torch.randn(3, 8)
    packs, made = [], []
    real_set, real_with = Program.set_weights, Program.with_weights
    monkeypatch.setattr(Program, "set_weights", lambda self, w: (packs.append(sorted(w)), real_set(self, w))[1])
    monkeypatch.setattr(Program, "with_weights", lambda self, w: (made.append(1), real_with(self, w))[1])
    with torch.no_grad():
        for lin in (one, two, one, two, one):
            assert torch.allclose(torch.compile(lin, backend="strata")(x), lin(x), rtol=1e-5, atol=1e-6)
        assert len(_fresh_dynamo) == 1 and len(made) == 1 and packs == []
        two.weight.mul_(2)
        for lin in (two, one, two):
            assert torch.allclose(torch.compile(lin, backend="strata")(x), lin(x), rtol=1e-5, atol=1e-6)
    assert len(made) == 1 and len(packs) == 1 and packs[0][0].endswith("weight")


def _python(code: str) -> str:
    """Run `code` in a fresh interpreter (nothing imported yet); its stdout."""
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


BARE = """
import sys, torch
from torch._dynamo.backends.registry import _COMPILER_FNS
print("strata" in sys.modules, "strata" in _COMPILER_FNS)
x = torch.randn(4, 8)
out = torch.compile(lambda x: torch.relu(x) * 2, backend="strata")(x)
assert torch.allclose(out, torch.relu(x) * 2, rtol=1e-6, atol=0)
print("strata" in sys.modules, "strata" in _COMPILER_FNS)
"""


def test_entry_point_registers_the_backend_without_import_strata():
    """torch finds strata through the torch_dynamo_backends entry point (pip install -e .)."""
    from importlib.metadata import entry_points
    assert "strata" in entry_points(group="torch_dynamo_backends").names
    assert _python(BARE).split() == ["False", "False", "True", "True"]


def test_import_strata_registers_when_no_entry_point_is_installed():
    hide = ("import importlib.metadata as md\n_real = md.entry_points\n"
            "md.entry_points = lambda **kw: md.EntryPoints(()) "
            "if kw.get('group') == 'torch_dynamo_backends' else _real(**kw)\nimport strata\n")
    assert _python(hide + BARE).split() == ["True", "True", "True", "True"]


def test_a_graph_that_only_updates_in_place_runs_a_program(_fresh_dynamo):
    """A graph returning nothing but updating its input in place compiles a program that writes
    the caller's tensor (an optimizer's step is one: tests/torch_compile/test_dynamo_training.py)."""
    def double(x):
        x.mul_(2)
    x = torch.arange(5.0)
    torch.compile(double, backend="strata")(x)
    assert torch.equal(x, torch.arange(5.0) * 2) and _fresh_dynamo[-1].program is not None


def test_what_the_program_would_not_write_back_is_refused_not_dropped():
    """A tensor updated in place that the program is not given is refused in one sentence, and
    with fallback runs eagerly, updating as eager does: a submodule's buffers updated inside a
    call_module (dynamo's graphs read what they update through get_attr, made inputs)."""
    bn = nn.BatchNorm1d(4)
    gm, x = torch.fx.symbolic_trace(nn.Sequential(bn)), torch.randn(3, 4)
    with torch.no_grad():
        with pytest.raises(StrataError, match=r"would not write back \(0\.num_batches_tracked, "
                                              r"0\.running_mean, 0\.running_var\)"):
            dynamo_backend.strata_backend(gm, [x])
        with pytest.warns(StrataFallbackWarning):
            dynamo_backend.strata_backend(gm, [x], {"fallback": True})(x)
    assert bn.num_batches_tracked.item() == 1


def test_a_copy_taken_before_an_update_in_place_is_returned_as_it_was(_fresh_dynamo):
    """`b = g.clone(); g.add_(1); return b` (SGD's first nesterov step with foreach): b is the
    value before the update (its own buffer, loop/scatter.py `snapshots`), g is updated."""
    def f(g):
        b = g.clone()
        g.add_(1)
        return b
    g = torch.zeros(3)
    b = torch.compile(f, backend="strata")(g)
    assert torch.equal(b, torch.zeros(3)) and torch.equal(g, torch.ones(3))
    assert _fresh_dynamo[-1].program is not None


def test_addcmul_with_a_value_runs_as_one_fma():
    """dynamo writes `t.addcmul_(a, b, value=v)` as prims.fma(a * b, v, t) (an optimizer's step
    does): strata has its rule."""
    def f(a, b, c):
        c = c.clone()
        c.addcmul_(a, b, value=0.5)
        return c * 2
    a, b, c = (torch.randn(5, 7) for _ in range(3))
    torch.testing.assert_close(torch.compile(f, backend="strata")(a, b, c), f(a, b, c))


def test_graphs_that_differ_only_in_a_constant_tensor_get_their_own_programs(_fresh_dynamo):
    """x[[1, 2]] and x[[0, 3]]: the index is each graph's own tensor attribute, so the graphs'
    keys differ (they once shared the first graph's program, and the second indexed rows 1, 2)."""
    x = torch.randn(5, 5, 5)
    for idx in ([1, 2], [0, 3]):
        torch._dynamo.reset()
        out = torch.compile(lambda x: x[idx], backend="strata", options={"device": "sim"})(x)
        assert torch.equal(out, x[idx]), idx
