"""The model zoo (tests/models/zoo.py): tiny random models of every listed transformers
architecture and a few plain PyTorch modules compile and match eager (float64 reference, the
docs/design.md tolerances) on the simulator, and the MoE, GPT-J, Cohere, ViT, CLIP, Whisper and CNN
entries natively on the CPU too. The list of architectures in docs/models.md comes from
`python -m tests.models.zoo`."""
import pytest

pytest.importorskip("transformers")

from conftest import run_and_compare  # noqa: E402
from zoo import ARCHS, LAYER_COUNTS, MIXED_LAYERS, PLAIN, build_any, layer_kinds  # noqa: E402


# the named models also run natively on the CPU target
NATIVE = {"mixtral", "qwen2_moe", "qwen3_moe", "gptj", "cohere", "vit", "clip_vision",
          "whisper_encoder", "cnn"}


def test_the_zoo_is_as_large_as_promised():
    assert len(ARCHS) >= 35 and len(PLAIN) >= 6


@pytest.mark.parametrize("name", [n for n, (_, _, kw) in ARCHS.items()
                                  if any(k in kw for k in LAYER_COUNTS)])
def test_one_layer_is_every_kind_of_layer(name):
    """An entry is built with one layer only if its layers are all of one kind (two otherwise)."""
    kinds = layer_kinds(name)
    assert (len(set(kinds)) > 1) == (name in MIXED_LAYERS), kinds


@pytest.mark.slow
@pytest.mark.parametrize("name", [*ARCHS, *PLAIN])
def test_zoo_entry_matches_eager(name):
    module, inputs = build_any(name)
    run_and_compare(module, inputs, contraction=True, native=name in NATIVE)
