"""Training through torch.compile(backend="strata") (issue 58): AOTAutograd's forward and
backward graphs both compiled by strata and run natively; the losses of 20 optimizer steps track
eager's within 1e-4 (fp32) at every step, one step's gradients pass the float64 check, and a
backward op strata lacks is named at compile time, in one sentence. The optimizer step compiled
too (`torch.compile(opt.step, backend="strata")`) updates the parameters and its state as eager's
does, and compiles once."""
import copy
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import HAS_CC
from strata.bench import check
from strata.torch_compile import backend as dynamo_backend

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: strata's CPU programs cannot "
                                                   "be built here (install gcc)")


@pytest.fixture(autouse=True)
def compiled(monkeypatch):
    """A clean dynamo cache, and the graphs strata compiled (so a test can tell it ran them)."""
    torch._dynamo.reset()
    # programs another test compiled (kept while not yet collected) are not this test's
    monkeypatch.setattr(dynamo_backend, "_SHARED", weakref.WeakValueDictionary())
    seen, real = [], dynamo_backend._compile
    monkeypatch.setattr(dynamo_backend, "_compile", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    yield seen
    torch._dynamo.reset()


def _train_both(model, batch, loss_of, steps=20):
    """(strata's losses, eager's losses): the same model, optimizer and batch, step by step."""
    ref = copy.deepcopy(model)
    fast = torch.compile(model, backend="strata")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, ref)]
    losses = ([], [])
    for _ in range(steps):
        for k, (run, opt) in enumerate(zip((fast, ref), opts)):
            loss = loss_of(run, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[k].append(loss.item())
    return losses


def _mse(run, batch):
    x, y = batch
    return nn.functional.mse_loss(run(x), y)


def test_one_steps_gradients_pass_the_float64_check(compiled):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 3))
    x, y = torch.randn(7, 16), torch.randn(7, 3)
    ref = _float64_mse_grads(model, x, y)
    nn.functional.mse_loss(torch.compile(model, backend="strata")(x), y).backward()
    _assert_grads_match(model, ref)


def _float64_mse_grads(model, x, y):
    """A float64 copy of `model` (taken before any step) with the MSE loss's gradients."""
    ref = copy.deepcopy(model).double()
    for p in ref.parameters():
        p.grad = None
    nn.functional.mse_loss(ref(x.double()), y.double()).backward()
    return ref


def _assert_grads_match(model, ref):
    """Every parameter's gradient against the float64 model's, at the fp32 tolerance."""
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        res = check.compare(name, "f32", p.grad.numpy(), r.grad.numpy(), check.tolerance("f32", True))
        assert res.passed, f"{name}: rel err {res.rel:.3g} (tol {res.tol})"


class CausalSelfAttention(nn.Module):
    """F.scaled_dot_product_attention, causal, with grouped KV heads: on the CPU torch runs it as
    a fused kernel whose backward op strata has no rule for; the backend trains its math."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4)
        o = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(o.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("conv", [
    nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=2),
    nn.Conv1d(3, 5, 4, stride=3, padding=2),
    nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1),
], ids=["conv2d-strided-dilated-grouped", "conv1d", "conv-transpose-input-grad"])
def test_convolution_gradients_pass_the_float64_check(conv, compiled):
    """convolution_backward as convolutions (strata/dynamo_training.py); a transposed
    convolution's weight gradient is not decomposed, so only its input's gradient is asked."""
    torch.manual_seed(4)
    x = torch.randn(2, conv.in_channels, *((9, 8) if isinstance(conv, nn.Conv2d) else
                                           (13,) if isinstance(conv, nn.Conv1d) else (5, 4)),
                    requires_grad=True)
    transposed = isinstance(conv, nn.ConvTranspose2d)
    conv.requires_grad_(not transposed)
    torch.compile(conv, backend="strata")(x).pow(2).sum().backward()
    ref = copy.deepcopy(conv).double()
    xd = x.detach().double().requires_grad_(True)
    ref(xd).pow(2).sum().backward()
    pairs = [("input", x.grad, xd.grad)]
    if not transposed:
        pairs += [(n, p.grad, r.grad) for (n, p), r in zip(conv.named_parameters(), ref.parameters())]
    for name, g, r in pairs:
        res = check.compare(name, "f32", g.numpy(), r.numpy(), check.tolerance("f32", True))
        assert res.passed, f"{name}: rel err {res.rel:.3g} (tol {res.tol})"


class TinyViT(nn.Module):
    """Patches by a strided convolution, a class token, a pre-norm encoder layer
    (nn.MultiheadAttention: torch calls its SDPA inside F.multi_head_attention_forward)."""

    def __init__(self, dim=32, patch=4, classes=5):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
        self.blocks = nn.Sequential(*[nn.TransformerEncoderLayer(
            dim, 4, 64, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
            for _ in range(1)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos
        return self.head(self.norm(self.blocks(t))[:, 0])


def _classify(run, batch):
    return nn.functional.cross_entropy(run(batch[0]), batch[1])


def test_a_backward_op_strata_lacks_is_named_at_compile_time():
    """A transposed convolution's weight gradient is not decomposed (torch_compile/training.py)."""
    up, x = nn.ConvTranspose2d(2, 3, 3, stride=2), torch.randn(1, 2, 4, 5)
    with pytest.raises(Exception, match=r"unsupported op aten\.convolution_backward"):
        torch.compile(up, backend="strata")(x)


def _cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
                         nn.Conv2d(8, 8, 3, stride=2, groups=2), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _llama():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tests" / "models"))
    from model_helpers import hf_model
    return hf_model("llama", num_hidden_layers=1).train()     # each kind of layer once


@pytest.mark.parametrize("name", ["cnn", "vit", "llama"])
def test_the_models_gradients_pass_the_float64_check(name, compiled):
    """One backward of each done-when model: every parameter's gradient against float64 eager,
    at docs/design.md's fp32 tolerance."""
    torch.manual_seed(6)
    model = {"cnn": _cnn, "vit": TinyViT, "llama": _llama}[name]()
    if name == "llama":
        ids = torch.randint(0, model.config.vocab_size, (2, 12))
        loss_of = lambda m, b: m(ids, labels=ids, use_cache=False).loss    # noqa: E731
        batch, batch64 = None, None
    else:
        x, y = _batch(name)
        loss_of, batch, batch64 = _classify, (x, y), (x.double(), y)
    ref = copy.deepcopy(model).double()
    loss_of(torch.compile(model, backend="strata"), batch).backward()
    loss_of(ref, batch64).backward()
    _assert_grads_match(model, ref)


def test_attention_trains_with_flash_kernels_on_the_gpu_path(compiled, cache_dir):
    """On the simulator (a GPU target) SDPA becomes strata::attention: the forward program writes
    each row's log-sum-exp, not the weights, and the backward runs dq, dk and dv as three flash
    kernels of the sum form (GQA's dk and dv summed over each group after). Gradients against
    float64 eager; no Lq x Lk buffer in either program (a fresh cache: a program read from one
    keeps no stages to look at)."""
    torch.manual_seed(8)
    model = CausalSelfAttention()
    x, y = _batch("attention")
    ref = _float64_mse_grads(model, x, y)
    fast = torch.compile(model, backend="strata", options={"device": "sim"})
    nn.functional.mse_loss(fast(x), y).backward()
    _assert_grads_match(model, ref)
    forward, backward = compiled
    fused = [[t.attention.op for t in c.program.lowered.tile.kernels if t.mode == "attention"]
             for c in (forward, backward)]
    assert [op.norm for op in fused[0]] == ["softmax"] and fused[0][0].lse is not None
    assert [op.norm for op in fused[1]] == ["sum"] * 3
    seq = x.shape[1]
    for c in (forward, backward):
        assert not [b for b in c.program.lowered.kernel.buffers if tuple(b.shape[-2:]) == (seq, seq)]


def test_multihead_attention_trains_through_flash_kernels_on_the_gpu_path(compiled, cache_dir):
    """nn.MultiheadAttention's SDPA, inside the F.multi_head_attention_forward call dynamo keeps
    whole, takes the flash path too: the tiny ViT's losses over 3 AdamW steps match eager's."""
    torch.manual_seed(7)
    model = TinyViT()
    ref = copy.deepcopy(model)
    batch = _batch("vit")
    fast = torch.compile(model, backend="strata", options={"device": "sim"})
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, ref)]
    for _ in range(3):
        losses = []
        for run, opt in zip((fast, ref), opts):
            loss = _classify(run, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-4 * abs(losses[1]), losses
    fused = [[t.attention.op.norm for t in c.program.lowered.tile.kernels if t.mode == "attention"]
             for c in compiled]
    assert fused == [["softmax"], ["sum"] * 3]


def test_a_transformers_llama_with_sdpa_trains_through_flash_kernels_on_the_gpu_path(compiled,
                                                                                     cache_dir):
    """transformers' SDPA attention passes its causal mask as a boolean tensor: the forward
    still fuses into one flash kernel, the backward into three; gradients against float64."""
    torch.manual_seed(6)
    model = _llama()
    model.config._attn_implementation = "sdpa"       # the layers share the config
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    ref = copy.deepcopy(model).double()
    run = torch.compile(model, backend="strata", options={"device": "sim"})
    run(ids, labels=ids, use_cache=False).loss.backward()
    ref(ids, labels=ids, use_cache=False).loss.backward()
    _assert_grads_match(model, ref)
    fused = [[t.attention.op.norm for t in c.program.lowered.tile.kernels if t.mode == "attention"]
             for c in compiled]
    assert fused == [["softmax"], ["sum"] * 3]


def _mlp():
    return nn.Sequential(nn.Linear(24, 48), nn.GELU(), nn.LayerNorm(48), nn.Linear(48, 5))


def _batch(name):
    if name == "llama":
        return None
    return {"mlp": (torch.randn(13, 24), torch.randn(13, 5)),
            "attention": (torch.randn(2, 9, 32), torch.randn(2, 9, 32)),
            "cnn": (torch.randn(4, 3, 11, 10), torch.randint(0, 4, (4,))),
            "vit": (torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,)))}[name]


@pytest.mark.parametrize("name", ["mlp", "attention", "cnn", "vit", "llama"])
def test_the_models_train_as_eager_does(name, compiled):
    """20 AdamW steps of each model through strata's forward and backward programs: the loss at
    every step within 1e-4 of eager's."""
    torch.manual_seed(7)
    model = {"mlp": _mlp, "attention": CausalSelfAttention, "cnn": _cnn, "vit": TinyViT,
             "llama": _llama}[name]()
    if name == "llama":
        ids = torch.randint(0, model.config.vocab_size, (2, 12))
        batch, loss_of = ids, lambda run, ids: run(ids, labels=ids, use_cache=False).loss   # noqa: E731
    else:
        batch, loss_of = _batch(name), _mse if name in ("mlp", "attention") else _classify
    got, want = _train_both(model, batch, loss_of)
    assert len(compiled) == 2 and all(c.program is not None for c in compiled)   # forward, backward
    assert got[-1] < got[0]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4, (got, want)


OPTIMIZERS = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
              "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1),
              "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
              "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True)}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_optimizer_step_updates_parameters_and_state_as_eager(name, compiled):
    """torch.compile(opt.step, backend="strata"): dynamo holds the parameters and the state as its
    graph's own attributes, which the program reads as inputs and updates in place. After 3 steps
    they equal those of PyTorch running dynamo's same graph (backend="eager") within 1e-6 (the
    state: 1e-6 of its largest value), and the uncompiled optimizer's within 1e-6 (dynamo traces
    the bias corrections as f32 tensor ops, the uncompiled AdamW as Python floats). The steps
    after a graph's first compile nothing (SGD's first step makes the momentum buffers: a graph
    of its own)."""
    torch.manual_seed(8)
    models = [_mlp() for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    start = copy.deepcopy(models[0])
    opts = [OPTIMIZERS[name](m.parameters()) for m in models]
    steps = [torch.compile(opts[0].step, backend="strata"),
             torch.compile(opts[1].step, backend="eager"), opts[2].step]
    batch, counts = _batch("mlp"), []
    for _ in range(3):
        for m, step in zip(models, steps):
            m.zero_grad()
            _mse(m, batch).backward()
            step()
        counts.append(len(compiled))
    assert counts == ([1, 2, 2] if name.startswith("sgd") else [1, 1, 1])
    assert all(c.program is not None for c in compiled)
    for (k, p), q, r, s in zip(models[0].named_parameters(),
                               *(m.parameters() for m in (*models[1:], start))):
        assert (p - s).abs().max() > 1e-4, k         # the program wrote the update
        for key, got in [("param", p), *opts[0].state[p].items()]:
            want, plain = (q, r) if key == "param" else (opts[1].state[q][key], opts[2].state[r][key])
            tol = 1e-6 * (1 if key == "param" else want.abs().max())
            assert (got - want).abs().max() <= tol, (k, key)
            torch.testing.assert_close(got, plain, rtol=0, atol=1e-6)


def test_a_second_optimizer_step_recompiles_nothing(compiled):
    """dynamo's guards hold: the second and third AdamW steps run the first step's program."""
    from torch._dynamo.utils import counters
    torch.manual_seed(9)
    model, batch = _mlp(), _batch("mlp")
    step = torch.compile(torch.optim.AdamW(model.parameters(), lr=1e-2).step, backend="strata")
    graphs = []
    for _ in range(3):
        _mse(model, batch).backward()
        step()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1] == graphs[2] and len(compiled) == 1


def test_a_graph_holding_the_parameters_as_weights_sees_the_steps_update(compiled):
    """The program bumps the version counters of what it updates in place, as eager's in-place
    ops do, so an inference graph that packed a parameter as a weight packs it again."""
    torch.manual_seed(10)
    model, (x, y) = _mlp(), _batch("mlp")
    infer = torch.compile(model, backend="strata")
    step = torch.compile(torch.optim.SGD(model.parameters(), lr=0.1).step, backend="strata")
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(infer(x), model(x), rtol=1e-5, atol=1e-5)
        _mse(model, (x, y)).backward()
        step()


def test_an_lr_tensor_follows_its_scheduler_without_a_recompile(compiled):
    """lr given as a tensor is an input of the step's program: StepLR halving it each step is
    seen, with one compile (a float lr would make dynamo recompile with a symbolic float)."""
    torch.manual_seed(11)
    models, batch = [_mlp()], _batch("mlp")
    models.append(copy.deepcopy(models[0]))
    opts = [torch.optim.AdamW(m.parameters(), lr=torch.tensor(1e-2)) for m in models]
    scheds = [torch.optim.lr_scheduler.StepLR(o, 1, 0.5) for o in opts]
    steps = [torch.compile(opts[0].step, backend="strata"), opts[1].step]
    for _ in range(3):
        for m, step, sched in zip(models, steps, scheds):
            m.zero_grad()
            _mse(m, batch).backward()
            step()
            sched.step()
    assert len(compiled) == 1
    for p, q in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)


def test_a_batch_of_another_size_compiles_forward_and_backward_for_it(compiled):
    """A second batch size makes dynamo's graph shape-dynamic: strata compiles the forward and
    backward programs of each size met at its first call (PyTorch's "SymIntArrayRef expected to
    contain only concrete integers" before), gradients eager's at every size; a size met before
compiles nothing."""
    torch.manual_seed(12)
    model = _mlp()
    ref = copy.deepcopy(model)
    fast = torch.compile(model, backend="strata")
    made = []
    for n in (13, 6, 13, 6, 13, 1):
        x, y = torch.randn(n, 24), torch.randn(n, 5)
        for run in (fast, ref):
            _mse(run, (x, y)).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
            p.grad = q.grad = None
        made.append(len(compiled))
    assert made[0] == 2 and made[1] > made[0] and made[3] == made[4] == made[2]  # met before: none
