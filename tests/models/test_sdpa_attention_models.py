"""transformers' SDPA attention (its default) fuses into one flash-attention kernel per layer,
though its causal mask is computed with a reduction (the fused kernel loads that mask from a
kernel of its own), and the logits match eager."""
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from model_helpers import hf_model  # noqa: E402
import strata  # noqa: E402
from strata.bench import check  # noqa: E402


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_sdpa_attention_is_one_kernel_per_layer(family):
    model = hf_model(family)
    if not hasattr(model, "set_attn_implementation"):
        pytest.skip("this transformers cannot switch a built model to SDPA")
    model.set_attn_implementation("sdpa")
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    prog = strata.compile(model, (ids,))
    fused = [k for k in prog.lowered.tile.kernels if k.mode == "attention"]
    assert len(fused) == model.config.num_hidden_layers, prog.ir("tile")
    assert "scaled_dot_product_attention" in prog.ir("torch")
    with torch.no_grad():
        want = model(ids).logits.double().numpy()
    res = check.compare("logits", "f32", prog(ids).detach().numpy(), want, check.tolerance("f32", True))
    assert res.passed, f"rel err {res.rel:.3g}"
