"""`strata generate --compare` on a bf16 model (strata/cli/generate.py `_verdict`): where strata's
greedy ids differ from bf16 eager's, float32 eager decides, and the line says so with the margin
(issue 29: SmolLM2-135M bf16 failed --compare on a near tie that bf16 eager tipped)."""
import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from model_helpers import hf_model  # noqa: E402
from strata.bench.decode_loops import hf_eager_greedy  # noqa: E402
from strata.cli.generate import _near_ties, _verdict  # noqa: E402
from strata.quant.formats import quantize  # noqa: E402

PROMPT, N = [3, 1, 4, 1, 5], 6


@pytest.fixture(scope="module")
def bf16_model():
    return hf_model("llama", seed=3).to(torch.bfloat16)


def _truth(model):
    return hf_eager_greedy(model.float() if model.dtype != torch.float32 else model,
                           PROMPT, N, (), "cpu")[0]


def test_strata_right_and_eager_tipped(bf16_model):
    import copy
    right = _truth(copy.deepcopy(bf16_model))
    tipped = right[:2] + [(right[2] + 1) % 96] + right[3:]
    text, ok = _verdict(right, tipped, bf16_model, PROMPT, N, ())
    assert ok and "first difference at generated token 2" in text
    assert "float32 agrees with strata" in text and "logit margin" in text


def test_strata_wrong_fails(bf16_model):
    import copy
    right = _truth(copy.deepcopy(bf16_model))
    wrong = right[:1] + [(right[1] + 7) % 96] + right[2:]
    text, ok = _verdict(wrong, right, bf16_model, PROMPT, N, ())
    assert not ok and "disagrees with strata too" in text


def test_float32_models_are_judged_as_they_are():
    model = hf_model("llama", seed=3)
    text, ok = _verdict([1, 2, 3], [1, 2, 4], model, PROMPT, 3, ())
    assert not ok and text == "no (first difference at generated token 2)"
    assert _verdict([1, 2], [1, 2], model, PROMPT, 2, ()) == ("yes", True)


def test_quantized_models_are_judged_by_near_ties():
    """int8 activations (QDOT=vnni) follow no eager trajectory: fed strata's ids, float32 eager
    must rank each of its tokens within twice the logit change int8 activations make (a GPU's
    rows, bf16 throughout: the change bf16 makes, and the line says so)."""
    import copy
    model = quantize(hf_model("llama", seed=3), "q8_0").to(torch.bfloat16)
    ref = copy.deepcopy(model).float()
    right = _truth(copy.deepcopy(model))
    text, ok = _near_ties("no", right, model, ref, PROMPT)
    assert ok and "near ties" in text and "within 0 of its best" in text
    with torch.no_grad():
        logits = ref(torch.tensor([PROMPT + right[:2]])).logits[0, -1]
    wrong = right[:2] + [int(logits.argmin())] + right[3:]    # the least likely token
    text, ok = _near_ties("no", wrong, model, ref, PROMPT)
    assert not ok and "at generated token 2" in text and "strata is wrong" in text
    text, ok = _near_ties("no", right, model, ref, PROMPT, int8=False)    # a GPU's bf16 rows
    assert ok and "that bfloat16 rounding moves the logits" in text and "int8" not in text
