"""Sampling inside the compiled decode programs (strata/models/sampling.py): with a fixed seed the
ids are reproducible and are what the reference sampler (sample_next run eagerly on Hugging
Face's logits, with the same uniforms) picks; greedy picking in the program is the argmax and
advances the step's own token and position in place; bad sampling options are one sentence."""
import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import torch  # noqa: E402

from conftest import HAS_CC  # noqa: E402
from model_helpers import hf_model, write_checkpoint  # noqa: E402
from strata.cli import main  # noqa: E402
from strata.core.errors import StrataError  # noqa: E402
from strata.models.decode import compile_decoder, new_caches, sample  # noqa: E402
from strata.models.sampling import Greedy, Sampling, sample_next  # noqa: E402

PROMPT, NEW, MAX_LEN = 4, 10, 16


def _reference(ref, prompt, s: Sampling, n: int) -> list[int]:
    us = s.uniforms(n)
    out, past, ids = [], None, torch.tensor([prompt])
    with torch.no_grad():
        for i in range(n):
            r = ref(input_ids=ids, past_key_values=past, use_cache=True)
            past = r.past_key_values
            out.append(int(sample_next(r.logits, us[i:i + 1], s)))
            ids = torch.tensor([[out[-1]]])
    return out


@pytest.mark.parametrize("device", [
    "sim", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CC, reason="no C compiler"))])
@pytest.mark.parametrize("s", [Sampling(temperature=0.8, top_k=20, top_p=0.9, seed=3),
                               Sampling(temperature=1.5, top_k=5, seed=11)], ids=["top-p", "top-k"])
def test_sampled_ids_match_the_reference_sampler(s, device):
    ref = hf_model("llama", num_hidden_layers=1)        # the sampling is after the last layer
    prompt = torch.randint(0, ref.config.vocab_size, (PROMPT,)).tolist()
    prefill, step = compile_decoder(ref, PROMPT, MAX_LEN, device=device, sampling=s)
    caches = new_caches(ref.config, MAX_LEN, torch.float32)
    ids, *_ = sample(prefill, step, caches, prompt, NEW, s)
    assert ids == _reference(ref, prompt, s, NEW)
    caches = new_caches(ref.config, MAX_LEN, torch.float32)
    assert sample(prefill, step, caches, prompt, NEW, s)[0] == ids          # reproducible
    other = Sampling(s.temperature, s.top_k, s.top_p, seed=s.seed + 1)
    assert _reference(ref, prompt, other, NEW) != ids or s.top_k == 1


@pytest.mark.parametrize("device", [
    "sim", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CC, reason="no C compiler"))])
def test_a_greedy_step_picks_the_argmax_and_advances_its_inputs_in_place(device):
    """The Greedy programs return eager's argmax ids; the step writes the id it picked into its
    input_ids and adds one to its position, so every call takes the same two tensors (on CUDA:
    one graph, no pointer changed, one read of the id per token)."""
    ref = hf_model("llama", num_hidden_layers=2)
    prompt = torch.randint(0, ref.config.vocab_size, (PROMPT,)).tolist()
    prefill, step = compile_decoder(ref, PROMPT, MAX_LEN, device=device, sampling=Greedy())
    caches = new_caches(ref.config, MAX_LEN, torch.float32)
    ref.generation_config.eos_token_id = None       # NEW tokens, an end-of-sequence id or not
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                            pad_token_id=0)[0, PROMPT:].tolist()
        first = prefill(torch.tensor([prompt]), *caches)
        token = first.reshape(1, 1).clone()
        position = torch.tensor([PROMPT])
        got, seen = [int(first)], (token.data_ptr(), position.data_ptr())
        for k in range(NEW - 1):
            picked = step(token, position, *caches)
            assert int(picked) == int(token) and int(position) == PROMPT + k + 1
            got.append(int(token))
    assert got == want and (token.data_ptr(), position.data_ptr()) == seen
    caches = new_caches(ref.config, MAX_LEN, torch.float32)
    assert sample(prefill, step, caches, prompt, NEW, Greedy())[0] == want


def test_generate_cli_samples_reproducibly(tmp_path, capsys):
    d = write_checkpoint(hf_model("llama", seed=3), tmp_path)
    argv = ["generate", str(d), "--prompt-ids", "1,5,9", "--max-new-tokens", "6",
            "--temperature", "0.7", "--top-k", "8", "--top-p", "0.95", "--seed", "4"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out.split("ids:")[1].split("\n")[0] == first.split("ids:")[1].split("\n")[0]
    assert "sampling: temperature 0.7, top-k 8, top-p 0.95, seed 4" in first


@pytest.mark.parametrize("flags, says", [
    (["--temperature", "-1"], "needs a temperature above 0"),
    (["--temperature", "1", "--top-k", "0"], "--top-k 0: give 1 to"),
    (["--temperature", "1", "--top-p", "1.5"], "--top-p 1.5: give a probability"),
    (["--top-k", "5"], "--top-k, --top-p and --seed sample: give --temperature too"),
])
def test_bad_sampling_options_are_one_sentence(flags, says, tmp_path, capsys):
    d = write_checkpoint(hf_model("llama", seed=3), tmp_path)
    assert main(["generate", str(d), "--prompt-ids", "1,2", *flags]) != 0
    assert says in capsys.readouterr().err


def test_sampling_check_rejects_a_top_k_beyond_the_vocabulary():
    with pytest.raises(StrataError, match="--top-k 300"):
        Sampling(top_k=300).check(vocab=1000)


def test_strata_generate_samples_from_python():
    import strata
    s = Sampling(temperature=0.9, top_k=12, top_p=0.8, seed=5)
    ref = hf_model("llama", seed=1)
    prompt = [3, 1, 4, 1, 5]
    out = strata.generate(ref, torch.tensor([prompt]), max_new_tokens=6,
                          device="cpu" if HAS_CC else "sim", sampling=s)
    assert out.tolist() == [prompt + _reference(ref, prompt, s, 6)]
