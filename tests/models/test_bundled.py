"""The bundled configs: each parses, builds on the meta device (no memory) with the published
parameter count and its family's features; MODEL arguments that cannot work fail in one sentence."""
import pytest

pytest.importorskip("transformers")

from strata.core.errors import ModelError, StrataError  # noqa: E402
from strata.frontend.torch_ir import shape_only  # noqa: E402
from strata.models.build import build  # noqa: E402
from strata.models.source import bundled_names  # noqa: E402

# name: (parameters, layers, hidden, heads, kv heads, tied) as each model card publishes them
PUBLISHED = {
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": (1_100_048_384, 22, 2048, 32, 4, False),
    "Qwen/Qwen2.5-0.5B": (494_032_768, 24, 896, 14, 2, True),
    "Qwen/Qwen2.5-7B": (7_615_616_512, 28, 3584, 28, 4, False),
    "HuggingFaceTB/SmolLM2-135M": (134_515_008, 30, 576, 9, 3, True),
    "meta-llama/Llama-3.2-1B": (1_235_814_400, 16, 2048, 32, 8, True),
    "meta-llama/Meta-Llama-3-8B": (8_030_261_248, 32, 4096, 32, 8, False),
}


def test_bundled_names():
    assert bundled_names() == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_bundled_config_builds_on_meta(name):
    params, layers, hidden, heads, kv, tied = PUBLISHED[name]
    b = build(name, seq_len=4)
    cfg, lm = b.config, b.model
    assert all(shape_only(p) for p in lm.parameters())
    assert sum(p.numel() for p in lm.parameters()) == params
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads) == (layers, hidden, heads, kv)
    assert (lm.lm_head.weight is lm.model.embed_tokens.weight) == tied
    assert b.dtype == "bf16" and "random weights (seed 0)" in b.weights
    attn = lm.model.layers[0].self_attn
    assert (attn.q_proj.bias is not None) == name.startswith("Qwen/")     # Qwen2: qkv bias


def test_llama32_rope_scaling_and_theta():
    cfg = build("meta-llama/Llama-3.2-1B").config
    rope = getattr(cfg, "rope_parameters", None) or {**cfg.rope_scaling, "rope_theta": cfg.rope_theta}
    assert rope["rope_type"] == "llama3" and rope["factor"] == 32.0
    assert rope["original_max_position_embeddings"] == 8192 and rope["rope_theta"] == 500000.0


def test_layer_of_a_7b_model_is_built_without_memory():
    b = build("Qwen/Qwen2.5-7B", layer=0, seq_len=128)
    assert b.example_inputs[0].shape == (1, 128, 3584) and shape_only(b.example_inputs[0])
    assert b.what == "Qwen/Qwen2.5-7B (bundled config; decoder layer 0 of 28, bf16)"


def test_names_are_case_insensitive():
    assert build("qwen/qwen2.5-0.5b", layer=0).source.name == "qwen/qwen2.5-0.5b"


@pytest.mark.parametrize("arg,words", [
    ("Qwen/Qwen9-1T", "unknown model 'Qwen/Qwen9-1T': give a local directory with a config.json "
                      "or one of the bundled names: HuggingFaceTB/SmolLM2-135M, Qwen/Qwen2.5-0.5B"),
])
def test_unknown_name(arg, words):
    with pytest.raises(ModelError) as e:
        build(arg)
    assert str(e.value).startswith(words)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="is a directory without a config.json"):
        build(str(tmp_path))


def test_layer_out_of_range():
    with pytest.raises(ModelError, match=r"--layer 30 is out of range: .* has layers 0..29"):
        build("HuggingFaceTB/SmolLM2-135M", layer=30)


def test_shapes_only_program_refuses_to_run():
    import torch
    from strata.api import compile_model
    prog, built = compile_model("HuggingFaceTB/SmolLM2-135M", layer=0, seq_len=4)
    assert len(prog.kernels) > 0 and "k_" in prog.source("cuda")
    with pytest.raises(StrataError, match="compiled from shapes only"):
        prog(torch.randn(1, 4, 576, dtype=torch.bfloat16))
