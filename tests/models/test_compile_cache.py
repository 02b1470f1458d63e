"""The model compile cache (strata/models/compile_cache.py): a second compile of the same model
captures and lowers nothing, runs the model's own weights (not copies, not the first model's),
and a changed model, a corrupt entry or STRATA_NO_CACHE=1 compiles again."""
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from model_helpers import hf_model  # noqa: E402

from strata.models.decode import compile_decoder, greedy, new_caches  # noqa: E402

PROMPT, MAX_LEN = [3, 1, 4, 1, 5], 9


def _llama(seed):
    """One layer: what is cached is the same whatever the depth."""
    return hf_model("llama", seed=seed, num_hidden_layers=1)


def _ids(model, device="sim"):
    prefill, step = compile_decoder(model, len(PROMPT), MAX_LEN, device=device)
    caches = new_caches(model.config, MAX_LEN, torch.float32)
    return greedy(prefill, step, caches, PROMPT, 3)[0], (prefill, step)


def _hf_ids(model):
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=3, do_sample=False,
                             pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


@pytest.fixture
def no_capture(monkeypatch):
    """After it is used, a capture is an error: the programs must come from the cache."""
    def refuse(*a, **k):
        raise AssertionError("captured again: the compile cache was not used")
    return lambda: monkeypatch.setattr("strata.models.decode.capture", refuse)


def test_second_compile_captures_nothing_and_binds_the_models_weights(cache_dir, no_capture):
    model = _llama(3)
    first, _ = _ids(model)
    assert len(list((cache_dir / "models").rglob("*.pkl"))) == 2          # prefill and step
    no_capture()
    again, (prefill, _) = _ids(model)
    assert again == first == _hf_ids(model)
    ptrs = {p.data_ptr() for p in model.parameters()}
    bound = [w for w in prefill.torch_program.weights.values() if w.data_ptr() in ptrs]
    assert len(bound) >= len(list(model.parameters())) - 1        # the model's tensors, not copies


def test_new_weights_of_the_same_architecture_reuse_the_entry(cache_dir, no_capture):
    _ids(_llama(3))
    no_capture()
    other = _llama(4)
    got, _ = _ids(other)
    assert got == _hf_ids(other)


def test_a_changed_config_compiles_again(cache_dir, monkeypatch):
    from strata.models import decode
    model = _llama(3)
    _ids(model)
    calls = []
    real = decode.capture
    monkeypatch.setattr(decode, "capture", lambda *a, **k: calls.append(1) or real(*a, **k))
    _ids(model)
    assert calls == []                          # the same model: from the cache
    model.config.rms_norm_eps = 1e-3            # changes the program: a new key
    for layer in model.model.layers:
        layer.input_layernorm.variance_epsilon = 1e-3
    got, _ = _ids(model)
    assert len(calls) == 2 and got == _hf_ids(model)


def test_a_corrupt_entry_is_compiled_again_and_replaced(cache_dir, caplog):
    model = _llama(3)
    first, _ = _ids(model)
    for entry in (cache_dir / "models").rglob("*.pkl"):
        entry.write_bytes(b"not a pickle")
    again, _ = _ids(model)
    assert again == first and "unusable" in caplog.text
    _ids(model)                                 # replaced: read back without a warning


def test_no_cache_stores_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("STRATA_NO_CACHE", "1")
    _ids(_llama(3))
    assert not (cache_dir / "models").exists()


def test_more_or_fewer_new_tokens_reuse_the_programs(cache_dir, no_capture):
    """The cache length is a power-of-two bucket (decode.cache_positions), not the exact need:
    5 + 3 and 5 + 9 positions both get 16, so the second generate compiles nothing."""
    from strata.models.decode import cache_positions, generate
    assert [cache_positions(n) for n in (1, 8, 16, 17, 100, 128, 129)] == [16, 16, 16, 32, 128,
                                                                          128, 256]
    model = _llama(3)
    generate(model, torch.tensor([PROMPT]), max_new_tokens=3)
    no_capture()
    got = generate(model, torch.tensor([PROMPT]), max_new_tokens=9)[0, len(PROMPT):].tolist()
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=9, do_sample=False,
                              pad_token_id=0)[0, len(PROMPT):].tolist()
    assert got == want


def test_an_edited_c_prelude_is_a_new_key(tmp_path, monkeypatch):
    """The key covers the C strata emits from, not only its Python: a program cached before a
    prelude was edited would otherwise run the old C (found editing c_qdot.h's prefetch), and the
    tuning database would apply schedules measured with the old kernels (its key read only *.py)."""
    from strata.tune import db
    from strata.version import source_digest
    versions = []
    monkeypatch.setattr(db, "source_digest", lambda: source_digest(tmp_path))
    (tmp_path / "codegen" / "preludes").mkdir(parents=True)
    (tmp_path / "codegen" / "c.py").write_text("X = 1\n")
    header = tmp_path / "codegen" / "preludes" / "c_qdot.h"
    header.write_text("#define ST_QAHEAD 4096\n")
    before = source_digest(tmp_path)
    versions.append(db.compiler_version.__wrapped__())
    header.write_text("#define ST_QAHEAD 1024\n")
    after = source_digest(tmp_path)
    versions.append(db.compiler_version.__wrapped__())
    assert after != before and versions[0] != versions[1]
    (tmp_path / "notes.txt").write_text("not source")
    assert source_digest(tmp_path) == after
