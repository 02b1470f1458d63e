"""Capture to Torch IR: printing, readable names, provenance, output structure, errors."""
import numpy as np
import pytest
import torch

import strata.frontend.capture as capture_mod
from strata.core.errors import UnsupportedOp
from strata.frontend.capture import capture, capture_snippet
from strata.frontend.snippet import parse_snippet
from strata.tensor.decompose import to_tensor_ir
from strata.tensor.eval import evaluate

RMS = "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))"
SEED = "torch.relu(torch.matmul(torch.randn(16,64) + torch.randn(64), torch.randn(64,16)))"


def test_rms_norm_torch_ir():
    prog = capture_snippet(parse_snippet(RMS))
    text = str(prog)
    lines = text.splitlines()
    assert lines[0] == "x: input (1, 32, 2048) f32"
    assert lines[1] == "p_weight: weight (2048,) f32"
    assert lines[2] == f"# <snippet>:1  {RMS}"
    assert lines[3].startswith("rms_norm = rms_norm(x, [2048], p_weight)")
    assert lines[3].endswith("-> (1, 32, 2048) f32")
    assert lines[-1] == "return rms_norm"
    assert prog.where("rms_norm") == f"<snippet>:1 `{RMS}`"
    assert set(prog.weights) == {"p_weight"}


def test_seed_matmul_torch_ir():
    prog = capture_snippet(parse_snippet(SEED))
    body = [line for line in str(prog).splitlines() if " = " in line]
    assert [line.split(" = ")[0] for line in body] == ["add", "matmul", "relu"]
    assert "add(x, y)" in body[0] and "-> (16, 64) f32" in body[0]
    assert "matmul(add, z)" in body[1] and "-> (16, 16) f32" in body[1]
    assert "relu(matmul)" in body[2]
    assert prog.input_names == ["x", "y", "z"]


def test_function_provenance_is_user_line():
    def f(x):
        return torch.exp(x) * 2   # the line provenance must point at

    prog = capture(f, (torch.randn(3),))
    w = prog.node("exp").where
    assert w.file.endswith("test_capture.py") and "torch.exp(x) * 2" in w.code
    assert prog.input_names == ["x"]


def test_output_structure():
    prog = capture(lambda x: (x + 1, [x * 2, x.sum()]), (torch.randn(3),))
    flat = [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0)]
    out = prog.unflatten(flat)
    assert isinstance(out, tuple) and isinstance(out[1], list) and len(out[1]) == 2


def test_weight_names_with_several_modules():
    prog = capture_snippet(parse_snippet("nn.Linear(4, 4)(nn.LayerNorm(4)(torch.randn(2, 4)))"))
    assert set(prog.weights) == {"p_layernorm_weight", "p_layernorm_bias", "p_linear_weight",
                                 "p_linear_bias"}
    assert "const_" not in str(prog)


@pytest.mark.parametrize("code,op", [
    ("torch.median(torch.randn(4, 5), 1).values", "aten.median"),
    ("torch.kthvalue(torch.randn(7), 2).values", "aten.kthvalue"),
])
def test_unsupported_op_names_op_and_line(code, op):
    prog = capture_snippet(parse_snippet(code))
    with pytest.raises(UnsupportedOp) as e:
        to_tensor_ir(prog)
    assert str(e.value) == f"unsupported op {op} (at <snippet>:1 `{code}`)"


@pytest.mark.parametrize("code", [
    RMS, SEED, "torch.softmax(torch.randn(4, 1000), dim=-1)",
    "nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8))(torch.randn(2, 8)).var(-1)",
    "torch.cat([torch.randn(2, 3), torch.randn(2, 1)], 1).flip(0).roll(1, 1)[:, 1:].t()",
])
def test_fast_path_matches_run_decompositions(code, monkeypatch):
    s = parse_snippet(code)
    fast = str(capture_snippet(s))
    monkeypatch.setattr(capture_mod, "FAST_PATH", False)
    assert str(capture_snippet(s)) == fast


def test_mutation_is_functionalised():
    def f(x):
        y = x * 2
        y.add_(1)
        return torch.nn.functional.dropout(y, 0.5, training=False)
    prog = capture(f, (torch.randn(3),))
    assert all(not n.op.split(".")[1].endswith("_") for n in prog.nodes), str(prog)
    to_tensor_ir(prog).verify()


def test_fast_path_keeps_reshape_and_to_and_makes_detach_functional(monkeypatch):
    """reshape and to (CompositeImplicit, taken by strata's rules as they are) and an in-place
    detach_ no longer send the graph through run_decompositions; the values are the same."""
    def f(x):
        y = (x * 2).reshape(6, 4).to(torch.float64)
        y.detach_()
        return y.t().reshape(-1).to(torch.float32) + 1
    x = torch.randn(4, 6)
    fast = capture(f, (x,))
    assert {"aten.reshape", "aten.to"} <= {n.packet for n in fast.nodes}
    assert not any(n.op.endswith("_.default") for n in fast.nodes), str(fast)
    monkeypatch.setattr(capture_mod, "FAST_PATH", False)
    slow = capture(f, (x,))
    assert "aten.reshape" not in {n.packet for n in slow.nodes}
    for prog in (fast, slow):
        tp = to_tensor_ir(prog)
        [got] = evaluate(tp, {tp.inputs[0].name: x.numpy()}).values()
        assert np.allclose(got, f(x).numpy())
