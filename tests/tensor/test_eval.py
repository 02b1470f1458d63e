"""The NumPy evaluator on hand-built Tensor IR: precisions, IndexMap valid/fill, Gather, argmax."""
import numpy as np
import pytest

from strata.core.expr import Var, call
from strata.tensor.eval import evaluate, evaluate_all
from strata.tensor.ir import (IDX, Elementwise, Full, Gather, IndexMap, Input, Iota, Reduce,
                              TensorProgram, TensorType)


def prog(*nodes, outputs=None, weights=None):
    p = TensorProgram(list(nodes), outputs or [nodes[-1].name], weights or {})
    p.verify()
    return p


def test_f64_vs_native_rounding():
    x = Input("x", TensorType((4,), "f16"))
    y = Elementwise("y", TensorType((4,), "f16"), op="divide", args=("x", 3.0))
    p = prog(x, y)
    xs = np.array([1, 2, 5, 7], dtype=np.float16)
    hi = evaluate(p, {"x": xs})["y"]
    lo = evaluate(p, {"x": xs}, precision="native")["y"]
    assert hi.dtype == np.float64 and lo.dtype == np.float16
    np.testing.assert_allclose(hi, xs.astype(np.float64) / 3)
    assert np.array_equal(lo, (xs.astype(np.float32) / 3).astype(np.float16))


def test_bf16_native_values_are_rounded_float32():
    x = Input("x", TensorType((3,), "bf16"))
    y = Elementwise("y", TensorType((3,), "bf16"), op="multiply", args=("x", 1.001))
    out = evaluate(prog(x, y), {"x": np.array([1.0, 3.0, 100.0], np.float32)}, "native")["y"]
    assert out.dtype == np.float32
    assert np.array_equal(out, np.array([1.0, 3.0, 100.0], np.float32))   # 1.001x rounds back


def test_index_map_valid_and_fill():
    x = Input("x", TensorType((3,), "f32"))
    i0 = Var("i0")
    pad = IndexMap("pad", TensorType((5,), "f32"), arg="x", index=(call("subtract", i0, 1),),
                   valid=call("logical_and", call("ge", i0, 1), call("lt", i0, 4)), fill=-1.0)
    out = evaluate(prog(x, pad), {"x": np.array([1.0, 2.0, 3.0], np.float32)})["pad"]
    assert out.tolist() == [-1.0, 1.0, 2.0, 3.0, -1.0]


def test_index_map_out_of_range_is_caught():
    x = Input("x", TensorType((3,), "f32"))
    bad = IndexMap("bad", TensorType((3,), "f32"), arg="x", index=(call("mod", call("add", Var("i0"), Var("i0")), 7),))
    p = TensorProgram([x, bad], ["bad"])
    with pytest.raises(IndexError):
        evaluate(p, {"x": np.zeros(3, np.float32)})


def test_gather_and_iota():
    w = Input("w", TensorType((4, 2), "f32"), kind="weight")
    ids = Input("ids", TensorType((3, 2), "i64"))
    g = Gather("g", TensorType((3, 2), "f32"), data="w", indices="ids", index=(IDX, Var("i1")))
    io = Iota("io", TensorType((3, 2), "i64"), axis=0)
    s = Elementwise("s", TensorType((3, 2), "f32"), op="add", args=("g", 1.0))
    p = prog(w, ids, g, io, s, outputs=["s", "io"], weights={"w": np.arange(8, dtype=np.float32).reshape(4, 2)})
    out = evaluate(p, {"ids": np.array([[3, 0], [1, 1], [0, 2]])})
    assert out["s"].tolist() == [[7.0, 2.0], [3.0, 4.0], [1.0, 6.0]]
    assert out["io"].tolist() == [[0, 0], [1, 1], [2, 2]]


def test_argmax_over_several_axes_is_row_major_first_occurrence():
    x = Input("x", TensorType((2, 2, 3), "f32"))
    r = Reduce("r", TensorType((2, 1, 1), "i64"), op="argmax", arg="x", axes=(1, 2))
    xs = np.array([[[0, 5, 1], [5, 2, 0]], [[1, 1, 1], [1, 1, 1]]], np.float32)
    assert evaluate(prog(x, r), {"x": xs})["r"].ravel().tolist() == [1, 0]


def test_reduce_keepdim_and_full():
    f = Full("f", TensorType((2, 3), "f32"), value=2.0)
    r = Reduce("r", TensorType((2, 1), "f32"), op="sum", arg="f", axes=(1,))
    m = Reduce("m", TensorType((1, 1), "f32"), op="max", arg="r", axes=(0, 1))
    vals = evaluate_all(prog(f, r, m), {})
    assert vals["r"].tolist() == [[6.0], [6.0]] and vals["m"].tolist() == [[6.0]]


def test_nan_propagates_through_max():
    x = Input("x", TensorType((3,), "f32"))
    r = Reduce("r", TensorType((1,), "f32"), op="max", arg="x", axes=(0,))
    assert np.isnan(evaluate(prog(x, r), {"x": np.array([1.0, np.nan, 2.0], np.float32)})["r"][0])


def test_cast_truncates_and_rounds():
    x = Input("x", TensorType((3,), "f32"))
    c = Elementwise("c", TensorType((3,), "i32"), op="cast", args=("x",))
    h = Elementwise("h", TensorType((3,), "f16"), op="cast", args=("x",))
    p = prog(x, c, h, outputs=["c", "h"])
    out = evaluate(p, {"x": np.array([-1.7, 2.9, 1.0001], np.float32)})
    assert out["c"].tolist() == [-1, 2, 1]
    assert out["h"].tolist() == [float(np.float16(-1.7)), float(np.float16(2.9)), 1.0]


def test_bad_precision():
    with pytest.raises(ValueError):
        evaluate(prog(Full("f", TensorType((1,), "f32"), value=1.0)), {}, precision="f16")
