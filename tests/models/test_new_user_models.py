"""Models as a new user meets them (issue 11): a config that gives no sizes is refused, generate
on a model it cannot decode says what it cannot do, and `strata.generate` is the Python path to
KV-cache decoding (torch.compile(model).generate runs eager)."""
import json

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import strata  # noqa: E402
from model_helpers import hf_model  # noqa: E402
from strata.cli import main  # noqa: E402


def test_config_without_sizes_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["compile", str(tmp_path), "--layer", "0", "--ir", "loop"]) == 1
    err = capsys.readouterr().err.strip()
    assert "does not give hidden_size (default 4096)" in err and "num_hidden_layers" in err
    assert len(err.splitlines()) == 1


def test_generate_on_gpt2_says_what_it_cannot_do(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 50,
         "n_positions": 32}))
    assert main(["generate", str(tmp_path), "--prompt-ids", "1,2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "strata generate" in err and "--layer" not in err and len(err.splitlines()) == 1


def test_strata_generate_matches_hf_greedy():
    model = hf_model("llama", seed=5)
    ids = torch.tensor([[3, 17, 42, 8]])
    got = strata.generate(model, ids, max_new_tokens=5)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    eos = model.config.eos_token_id
    new, ref = got[0, 4:].tolist(), want[0, 4:].tolist()
    assert got[0, :4].tolist() == ids[0].tolist()
    assert new == (ref[:ref.index(eos) + 1] if eos in ref else ref)
