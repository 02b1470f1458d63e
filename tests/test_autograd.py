"""strata/api/autograd.py: a strata.compile program compiled or called where autograd is on says it is
inference only, in one sentence, never silently (issue 51): a warning at compile time, and
NoBackward from a backward through its outputs, instead of outputs without history and
PyTorch's "element 0 of tensors does not require grad". (torch.compile's backend trains.)"""
import re
import warnings

import pytest
import torch

import strata
from strata.api.autograd import NoBackward, StrataNoGradWarning
from strata.core.errors import StrataError

ONE_SENTENCE = re.escape("strata compiles no backward yet): run it under torch.no_grad()")


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4), torch.randn(2, 8)


def test_compiling_a_module_whose_parameters_require_grad_warns_once():
    model, x = _linear()
    with pytest.warns(StrataNoGradWarning, match="is inference only") as caught:
        strata.compile(model, (x,))
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert caught[0].filename == __file__                # the user's line, not strata's
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # under no_grad: nothing to say
        with torch.no_grad():
            strata.compile(model, (x,))


def test_a_backward_through_the_outputs_is_one_strata_sentence():
    model, x = _linear()
    with pytest.warns(StrataNoGradWarning):
        program = strata.compile(model, (x,))
    out = program(x)
    assert out.requires_grad and torch.allclose(out, model(x), atol=1e-5)
    with pytest.raises(NoBackward, match=ONE_SENTENCE) as e:
        out.sum().backward()
    assert isinstance(e.value, StrataError) and "\n" not in str(e.value)
    with pytest.raises(NoBackward):
        torch.autograd.grad(out.sum(), [model.weight])
    mixed = program(x).sum() + model(x).sum()           # its gradients are never skipped silently
    with pytest.raises(NoBackward):
        mixed.backward()
    with torch.no_grad():
        assert not program(x).requires_grad
    with torch.inference_mode():
        assert not program(x).requires_grad


def test_an_input_that_requires_grad_reaches_the_same_sentence():
    program = strata.compile(lambda a: torch.tanh(a) * 2, (torch.randn(4, 4),))
    assert not program(torch.randn(4, 4)).requires_grad          # nothing requires grad
    out = program(torch.randn(4, 4, requires_grad=True))
    with pytest.raises(NoBackward, match=ONE_SENTENCE):
        out.sum().backward()


def test_a_training_step_through_torch_compile_gets_gradients_not_the_sentence():
    """torch.compile's backend compiles the backward too (tests/torch_compile/test_dynamo_training.py):
    nothing there is inference only."""
    torch._dynamo.reset()
    model, x = _linear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StrataNoGradWarning)
        torch.compile(model, backend="strata")(x).pow(2).mean().backward()
    got = model.weight.grad.clone()
    model.weight.grad = None
    model(x).pow(2).mean().backward()
    assert torch.allclose(got, model.weight.grad, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
