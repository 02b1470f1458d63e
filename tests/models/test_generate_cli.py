"""`strata generate MODEL` (strata/cli/generate.py): greedy ids on one line, timings, --compare
against Hugging Face eager, and one sentence with a non-zero exit for each bad input."""
import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import torch  # noqa: E402

from model_helpers import hf_model, write_checkpoint  # noqa: E402
from strata.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama")
    return write_checkpoint(hf_model("llama", seed=3), d)


def _ids(out: str, label: str) -> list[int]:
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(label))
    return [int(x) for x in lines[at + 1].split("ids:")[1].split()]


def test_generate_prints_ids_that_agree_with_hf_eager(tiny_dir, capsys):
    ref = hf_model("llama", seed=3)
    prompt = torch.randint(0, ref.config.vocab_size, (5,)).tolist()
    rc = main(["generate", str(tiny_dir), "--prompt-ids", ",".join(map(str, prompt)),
               "--max-new-tokens", "6", "--max-len", "16", "--compare"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "weights: loaded from 1 safetensors file" in out
    assert "prefill" in out and "tokens/s" in out
    got = _ids(out, "strata (sim)")
    assert got == _ids(out, "hf eager (cpu)")
    assert "ids agree with hf eager (cpu): yes" in out
    eos = ref.config.eos_token_id
    with torch.no_grad():                     # the same greedy decoding, stopping at eos
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                            pad_token_id=0)[0, 5:].tolist()
    assert got == want[:want.index(eos) + 1] if eos in want else got == want


@pytest.mark.parametrize("argv, says", [
    (["no/such-model", "--prompt-ids", "1"], "unknown model"),
    (["missing.gguf", "--prompt-ids", "1"], "missing.gguf: no such file or directory"),
    (["./no/such/dir", "--prompt-ids", "1"], "./no/such/dir: no such file or directory"),
    (["{dir}", "--prompt-ids", " , "], "the prompt is empty"),
    (["{dir}", "--prompt-ids", "1,x"], "expected integers"),
    (["{dir}", "--prompt-ids", "1,2", "--max-new-tokens", "9", "--max-len", "10"], "does not fit"),
    (["{dir}", "--prompt-ids", "1,100000"], "outside the vocabulary"),
    (["{dir}", "--prompt", "hello"], "has no tokenizer"),
    (["{dir}"], "give --prompt-ids 1,2,3 (or --prompt TEXT where MODEL carries a tokenizer)"),
    (["TinyLlama/TinyLlama-1.1B-Chat-v1.0", "--prompt", "hello"], "has no tokenizer"),
])
def test_bad_input_is_one_sentence(argv, says, tiny_dir, capsys):
    rc = main(["generate", *[a.replace("{dir}", str(tiny_dir)) for a in argv]])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and says in err and len(err.splitlines()) == 1, err
    assert "Traceback" not in err


def test_a_config_without_the_models_sizes_names_them(tiny_dir, tmp_path, capsys):
    """Issue 51: it said "prompt id 1 is outside the vocabulary (0..-1)"."""
    config = json.loads((tiny_dir / "config.json").read_text())
    del config["vocab_size"], config["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    rc = main(["generate", str(tmp_path), "--prompt-ids", "1,2"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    assert "config.json does not give hidden_size (default 4096), vocab_size (default 32000)" in err


def test_the_simulators_size_refusal_names_both_native_devices(tiny_dir, capsys, monkeypatch):
    monkeypatch.setattr("strata.cli.generate.SIM_MAX_PARAMS", 1000)
    rc = main(["generate", str(tiny_dir), "--prompt-ids", "1,2"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    assert err.endswith("use --device cpu (natively) or --device cuda"), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_device_cuda_without_a_gpu(tiny_dir, capsys):
    rc = main(["generate", str(tiny_dir), "--prompt-ids", "1,2", "--device", "cuda"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "GPU" in err and len(err.splitlines()) == 1
