"""A decoder exported with two layers and the rest repeated (strata/models/layer_replica.py)
is the program a whole-model export gives: the same ops, the same logits on the simulator, and
Hugging Face's greedy ids; a model whose layers differ is exported whole."""
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from model_helpers import hf_model  # noqa: E402
from strata.models import decode, layer_replica  # noqa: E402
from strata.models.decode import compile_decoder, new_caches  # noqa: E402

PROMPT, MAX_LEN = [3, 1, 4, 1, 5], 9


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.setenv("STRATA_NO_CACHE", "1")


def _compile(model, whole: bool, monkeypatch):
    notes = []
    with monkeypatch.context() as m:
        if whole:
            m.setattr(layer_replica, "same_layers", lambda *a: False)
        programs = compile_decoder(model, len(PROMPT), MAX_LEN, progress=notes.append)
    return programs, notes


def _logits(programs, model):
    prefill, step = programs
    caches = new_caches(model.config, MAX_LEN, torch.float32)
    first = prefill(torch.tensor([PROMPT]), *caches)
    nxt = int(first[0, -1].argmax())
    second = step(torch.tensor([[nxt]]), torch.tensor([len(PROMPT)]), *caches)
    return first, second, caches


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_repeated_layers_are_the_whole_export(family, monkeypatch):
    model = hf_model(family, seed=5, num_hidden_layers=3)      # one layer repeated
    fast, notes = _compile(model, False, monkeypatch)
    assert any("exported two of the 3 layers" in n for n in notes)
    whole, _ = _compile(model, True, monkeypatch)
    for a, b in zip(fast, whole):
        assert sorted(n.op for n in a.torch_program.nodes) == sorted(n.op for n in b.torch_program.nodes)
        assert list(a.torch_program.inputs) == list(b.torch_program.inputs)
        assert set(a.torch_program.mutations) == set(b.torch_program.mutations)
        assert len(a.torch_program.weights) == len(b.torch_program.weights)
    got, want = _logits(fast, model), _logits(whole, model)
    for g, w in zip(got[:2], want[:2]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    for g, w in zip(got[2], want[2]):           # every layer's cache written the same
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        hf = model(torch.tensor([PROMPT])).logits[:, -1:]
    torch.testing.assert_close(got[0], hf, rtol=1e-4, atol=1e-4)


def test_a_layer_that_differs_is_exported_whole(monkeypatch):
    model = hf_model("llama", seed=5, num_hidden_layers=3)
    model.model.layers[2].input_layernorm.variance_epsilon = 0.25      # no parameter changes
    assert not layer_replica.same_layers(model.model.layers)
    (prefill, step), notes = _compile(model, False, monkeypatch)
    assert not any("exported two" in n for n in notes)
    got = _logits((prefill, step), model)[0]
    with torch.no_grad():
        want = model(torch.tensor([PROMPT])).logits[:, -1:]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_mixed_layer_types_are_not_one_template():
    model = hf_model("llama", seed=5, num_hidden_layers=3)
    model.config.layer_types = ["full_attention", "sliding_attention", "full_attention"]
    assert not layer_replica.same_layers(model.model.layers, model.config)
    assert layer_replica.same_layers(model.model.layers, None)
    assert decode.cache_names(2) == ["k_cache_0", "v_cache_0", "k_cache_1", "v_cache_1"]
