"""safetensors checkpoints: one file or shards load with dtype conversion and tied embeddings;
a tensor that disagrees with the config is a one-sentence error naming it."""
import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from model_helpers import hf_model, write_checkpoint  # noqa: E402
from strata.core.errors import CheckpointMismatch  # noqa: E402
from strata.frontend.torch_ir import shape_only  # noqa: E402
from strata.models.build import build  # noqa: E402


def _same_weights(built_lm, ref_lm, dtype=torch.float32):
    want = ref_lm.state_dict()
    got = built_lm.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == dtype, k
        assert torch.equal(got[k], want[k].to(dtype)), k


def test_sharded_checkpoint_loads(tmp_path):
    ref = hf_model("llama")
    write_checkpoint(ref, tmp_path, shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    b = build(str(tmp_path), materialise=True, dtype="fp32", seq_len=4)
    assert b.weights.startswith("loaded from ") and "safetensors files" in b.weights
    _same_weights(b.model, ref)


def test_tied_embeddings_and_dtype_conversion(tmp_path):
    ref = hf_model("qwen2")
    write_checkpoint(ref, tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    b = build(str(tmp_path), materialise=True, dtype="bf16")
    lm = b.model
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    _same_weights(lm, ref, torch.bfloat16)
    assert lm.model.rotary_emb.inv_freq.dtype == torch.float32          # as transformers keeps it
    assert torch.equal(lm.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)


def test_one_layer_loads_only_that_layer(tmp_path):
    ref = hf_model("llama3")
    write_checkpoint(ref, tmp_path)
    b = build(str(tmp_path), layer=1, materialise=True, dtype="fp32", seq_len=5)
    assert b.model.model.layers[0].self_attn.q_proj.weight.is_meta
    assert torch.equal(b.module.layer.mlp.up_proj.weight, ref.model.layers[1].mlp.up_proj.weight)
    assert torch.equal(b.module.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)   # llama3 scaling


def test_shapes_checked_without_loading(tmp_path):
    write_checkpoint(hf_model("smollm2"), tmp_path)
    b = build(str(tmp_path), seq_len=4)
    assert all(shape_only(p) for p in b.model.parameters())
    assert "not loaded, compiling needs shapes only" in b.weights and "checked" in b.weights


def _rewrite(path, fn):
    tensors = load_file(path)
    fn(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.__setitem__("model.layers.1.self_attn.k_proj.weight", torch.zeros(16, 64)),
     "checkpoint tensor model.layers.1.self_attn.k_proj.weight has shape [16, 64] but the config "
     "gives [32, 64]"),
    (lambda t: t.pop("model.norm.weight"),
     "the checkpoint has no tensor model.norm.weight (shape [64]) that the config needs"),
    (lambda t: t.__setitem__("model.layers.7.mlp.up_proj.weight", torch.zeros(2, 2)),
     "checkpoint tensor model.layers.7.mlp.up_proj.weight (model.safetensors) is not a tensor of "
     "the model its config describes"),
])
def test_mismatch_names_the_tensor(tmp_path, edit, message):
    write_checkpoint(hf_model("llama"), tmp_path)
    _rewrite(tmp_path / "model.safetensors", edit)
    for materialise in (False, True):
        with pytest.raises(CheckpointMismatch) as e:
            build(str(tmp_path), materialise=materialise)
        assert str(e.value) == message


def test_missing_shard_is_named(tmp_path):
    write_checkpoint(hf_model("llama"), tmp_path, shard_size="40KB")
    (tmp_path / "model-00002-of-00012.safetensors").unlink()
    with pytest.raises(CheckpointMismatch, match="lists model-00002-of-00012.safetensors, which is not in"):
        build(str(tmp_path))


def test_random_weights_without_checkpoint_are_seeded(tmp_path):
    write_checkpoint(hf_model("llama"), tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    a = build(str(tmp_path), materialise=True, dtype="fp32")
    b = build(str(tmp_path), layer=1, materialise=True, dtype="fp32")
    assert a.weights == f"random (seed 0): {tmp_path} has no checkpoint"
    assert torch.equal(a.model.model.layers[1].self_attn.o_proj.weight,
                       b.model.model.layers[1].self_attn.o_proj.weight)
    assert torch.all(a.model.model.norm.weight == 1)
