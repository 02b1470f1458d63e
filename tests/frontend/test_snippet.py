"""`-c` snippets: inputs in order of appearance, hoisted modules, one-sentence errors."""
import pytest
import torch

from strata.core.errors import SnippetError
from strata.frontend.snippet import parse_snippet


def test_inputs_in_order():
    s = parse_snippet("torch.relu(torch.matmul(torch.randn(16,64) + torch.randn(64), torch.randn(64,16)))")
    assert s.input_names == ["x", "y", "z"]
    assert [tuple(t.shape) for t in s.example_inputs] == [(16, 64), (64,), (64, 16)]
    out = s.module(*s.example_inputs)
    assert out.shape == (16, 16) and (out >= 0).all()


def test_many_inputs_and_kinds():
    s = parse_snippet("torch.randn(2) + torch.rand(2) + torch.randint(0, 5, (2,)) + torch.randn(2)")
    assert s.input_names == ["x", "y", "z", "x3"]
    assert s.example_inputs[2].dtype == torch.int64


def test_module_hoisted_once_and_deterministic():
    a = parse_snippet("torch.nn.Linear(8, 4)(torch.randn(3, 8))")
    b = parse_snippet("torch.nn.Linear(8, 4)(torch.randn(3, 8))")
    assert a.input_names == ["x"]
    params = dict(a.module.named_parameters())
    assert set(params) == {"linear.weight", "linear.bias"}
    assert torch.equal(params["linear.weight"], dict(b.module.named_parameters())["linear.weight"])
    assert torch.equal(a.example_inputs[0], b.example_inputs[0])
    assert not a.module.linear.training


def test_namespace_and_constants():
    s = parse_snippet("F.gelu(nn.RMSNorm(16)(torch.randn(2, 16))) * math.pi + torch.arange(16)")
    assert s.input_names == ["x"]
    assert s.module(*s.example_inputs).shape == (2, 16)


@pytest.mark.parametrize("code,words", [
    ("torch.randn(3", "not a Python expression"),
    ("undefined_name(torch.randn(3))", "NameError"),
    ("torch.randn(3) @ torch.randn(4)", "failed to evaluate"),
    ("x = 3", "not a Python expression"),
])
def test_bad_snippets(code, words):
    with pytest.raises(SnippetError) as e:
        parse_snippet(code)
    msg = str(e.value)
    assert words in msg and "\n" not in msg
