"""Whole-model prefill through every stage and the simulator: the logits of tiny random models of
each family (written as checkpoints and read back) match Hugging Face eager in float64."""
import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import torch  # noqa: E402

from conftest import HAS_CC, compile_with_nvrtc  # noqa: E402
from model_helpers import FAMILIES, hf_model, write_checkpoint  # noqa: E402
import strata  # noqa: E402
from strata.bench import check  # noqa: E402
from strata.api import compile_model  # noqa: E402
from strata.models.wrappers import CausalLMLogits, DecoderLayer  # noqa: E402
from strata.kernel_ir.verify import verify_program

SEQ = 8


def _assert_close(name, got, ref):
    res = check.compare(name, "f32", got, ref, check.tolerance("f32", True))
    assert res.passed, f"{name}: rel err {res.rel:.3g}, max abs {res.max_abs:.3g} (tol {res.tol})"


DEVICES = ["sim", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CC, reason="no C compiler"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["qwen2", "smollm2", "llama3"])
def test_prefill_logits_from_checkpoint(family, device, tmp_path):
    ref = hf_model(family, num_hidden_layers=1)    # two layers: test_strata_compile_takes_a_hf_model
    write_checkpoint(ref, tmp_path)
    prog, built = compile_model(str(tmp_path), seq_len=SEQ, dtype="fp32", device=device,
                                materialise=True)
    verify_program(prog.lowered.kernel)
    weights = prog.torch_program.weights
    assert "p_model_embed_tokens_weight" in weights
    assert ("p_lm_head_weight" in weights) == (not ref.config.tie_word_embeddings)   # one buffer if tied
    ids = torch.randint(0, ref.config.vocab_size, (1, SEQ))
    logits = prog(ids)
    assert isinstance(logits, torch.Tensor) and logits.shape == (1, SEQ, ref.config.vocab_size)
    want = check.eager_reference(CausalLMLogits(ref), (ids,))[0]
    _assert_close(family, logits.numpy(), want)


def test_strata_compile_takes_a_hf_model():
    """strata.compile(hf_model, (ids,)): the program returns the logits tensor."""
    ref = hf_model("llama")
    ids = torch.randint(0, ref.config.vocab_size, (1, SEQ))
    prog = strata.compile(ref, (ids,))
    assert prog.torch_program.input_names == ["input_ids"]
    compile_with_nvrtc(prog)
    out = prog(ids)
    with torch.no_grad():
        eager = ref(ids).logits
    assert isinstance(out, torch.Tensor) and out.shape == eager.shape
    _assert_close("llama", out.detach().numpy(), check.eager_reference(CausalLMLogits(ref), (ids,))[0])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decoder_layer_wrapper_matches_the_model(family):
    """DecoderLayer(model, i) on layer i's input gives what the whole model's layer i gives."""
    ref = hf_model(family)
    ids = torch.randint(0, ref.config.vocab_size, (1, SEQ))
    with torch.no_grad():
        hidden = ref(ids, output_hidden_states=True, use_cache=False).hidden_states
        got = DecoderLayer(ref, 0)(hidden[0])
    torch.testing.assert_close(got, hidden[1], rtol=1e-5, atol=1e-5)


def test_one_layer_through_the_simulator(tmp_path):
    ref = hf_model("qwen2")
    write_checkpoint(ref, tmp_path)
    prog, built = compile_model(str(tmp_path), layer=1, seq_len=SEQ, dtype="fp32", materialise=True)
    x = torch.randn(1, SEQ, ref.config.hidden_size)
    want = check.eager_reference(DecoderLayer(ref, 1), (x,))[0]
    _assert_close("layer 1", prog(x).numpy(), want)


def test_a_prompt_on_a_gpu_reads_its_roped_q_and_k_as_stored_rows(tmp_path):
    """From 64 queries the attention kernel reads Q and K after RoPE from buffers kernels of
    their own wrote once (loop/attention.computed_operands), not recomputed for every block of
    queries: its K tiles are then plain copies (cp.async); still eager's numbers."""
    seq = 64
    ref = hf_model("llama", num_hidden_layers=1, max_position_embeddings=128)
    write_checkpoint(ref, tmp_path)
    prog, built = compile_model(str(tmp_path), layer=0, seq_len=seq, dtype="fp32", materialise=True)
    (att,) = [t.attention for t in prog.lowered.tile.kernels if t.mode == "attention"]
    assert [len(o.body) for o in (att.op.q, att.op.k)] == [1, 1], "Q or K computed in the kernel"
    x = torch.randn(1, seq, ref.config.hidden_size)
    want = check.eager_reference(DecoderLayer(ref, 0), (x,))[0]
    _assert_close("layer 0", prog(x).numpy(), want)
