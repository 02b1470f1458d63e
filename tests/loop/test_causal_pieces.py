"""Causal attention on a CPU runs in pieces of query rows, each over the keys its rows can see
(loop/causal_pieces.py): compared natively with float64 eager at odd sizes, Lq != Lk, GQA and
bf16; keys no piece may see are poisoned with NaN and must not matter (the unsplit kernels read
them: 0 * NaN); what is not a causal chain is left whole."""
import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import strata
from conftest import HAS_CC
from strata.bench import check
from strata.core.context import Context
from strata.core.expr import Const, Op, Var
from strata.loop.causal_pieces import _line, _past_line
from strata.loop.ir import Accum, Let, Load, Loop

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


def _compile(fn, inputs):
    log = io.StringIO()
    prog = strata.compile(fn, inputs, device="cpu", ctx=Context(verbosity=2, stream=log))
    return prog, log.getvalue()


def _matches(prog, fn, inputs):
    for res in check.verify(prog, fn, inputs, True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"


def _key_extents(prog, name: str) -> list[int]:
    """The extent of each piece's last loop (the sum over keys) of kernel `name`."""
    out = []
    for k in prog.lowered.loop.kernels:
        if k.name.startswith(name + "_q"):
            loops = [s for s in _walk(k.body) if isinstance(s, Loop)]
            out.append(loops[-1].extent)
    return out


def _walk(body):
    for s in body:
        yield s
        for b in s.bodies():
            yield from _walk(b)


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("lq,lk,hk,dt", [(130, 130, 2, torch.float32),
                                         (131, 300, 1, torch.float32),
                                         (200, 200, 2, torch.bfloat16)])
def test_pieces_match_eager(lq, lk, hk, dt):
    q = torch.randn(1, 2, lq, 16, dtype=dt)
    k, v = torch.randn(1, hk, lk, 16, dtype=dt), torch.randn(1, hk, lk, 16, dtype=dt)
    prog, log = _compile(_causal, (q, k, v))
    assert "causal_pieces:" in log and f"{lq} queries in pieces of 64" in log
    _matches(prog, _causal, (q, k, v))
    pieces = -(-lq // 64)
    assert _key_extents(prog, "k_scaled_dot_product_attention_reduce") == \
        [min(64 * (p + 1), lq, lk) for p in range(pieces)]


def test_keys_past_the_last_query_are_never_read():
    """130 queries see keys 0..129; keys 130.. are NaN. Whole, P @ V would add 0 * NaN."""
    q, k, v = torch.randn(1, 2, 130, 8), torch.randn(1, 2, 400, 8), torch.randn(1, 2, 400, 8)
    prog, _ = _compile(_causal, (q, k, v))
    ref = _causal(q, k, v)
    k[:, :, 130:], v[:, :, 130:] = float("nan"), float("nan")
    got = prog(q, k, v)
    assert not got.isnan().any()
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("why", ["no mask", "float mask", "scores returned", "few queries",
                                 "vectors"])
def test_what_is_not_a_causal_chain_runs_whole(why):
    q, k, v = torch.randn(1, 2, 130, 8), torch.randn(1, 2, 130, 8), torch.randn(1, 2, 130, 8)
    mask = torch.randn(130, 130)
    fn, inputs = {
        "no mask": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v)),
        "float mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                       (q, k, v, mask)),
        "scores returned": (lambda q, k, v: _scores_too(q, k, v), (q, k, v)),
        "few queries": (_causal, (q[:, :, :100], k, v)),
        "vectors": (lambda x, w: torch.softmax(torch.cumsum(x @ w, 0), 0) @ w.T,
                    (torch.randn(200), torch.randn(200, 300))),
    }[why]
    prog, log = _compile(fn, inputs)
    assert "causal_pieces:" not in log
    assert not any("_q0" in k.name for k in prog.lowered.loop.kernels)
    _matches(prog, fn, inputs)


def _scores_too(q, k, v):
    s = (q @ k.transpose(-1, -2)).masked_fill(torch.ones(130, 130, dtype=torch.bool).triu(1),
                                              float("-inf"))
    return torch.softmax(s, -1) @ v, s


def test_the_fold_past_the_line():
    """Lines drawn both ways; past j <= i a predicated load reads 0 and where() picks -inf, so
    a max adds its identity, but a sum of where(j <= i, x, 1.0) adds 1 each key: kept; a score
    plus the dtype's minimum (transformers' mask) is -inf to exp."""
    pred = Op("le", (Var("j"), Var("i")), "bool")
    i3 = Op("add", (Var("i"), Const(3)), "i64")
    assert _line(pred, "i", "j") == (0, True)
    assert _line(Op("lt", (Var("j"), i3), "bool"), "i", "j") == (2, True)
    assert _line(Op("ge", (Op("subtract", (Var("j"), Var("i")), "i64"), Const(1)), "bool"),
                 "i", "j") == (0, False)
    past = lambda e: None if _line(e, "i", "j") is None else not _line(e, "i", "j")[1]
    read = lambda s: Const(0.0, s.dtype) if s.pred is not None and past(s.pred) is False else None
    where = lambda other: Let("w", Op("where", (Var("m"), Var("x"), Const(other, "f32")), "f32"))
    body = (Load("x", "s", (Var("i"), Var("j")), "f32", pred), Let("m", pred), where(-np.inf))
    assert _past_line(body + (Accum("a", "max", Var("w", "f32")),), past, read, {})[0]
    assert not _past_line(body[:2] + (where(1.0), Accum("a", "sum", Var("w", "f32"))), past,
                          read, {})[0]
    masked = (Load("x", "s", (Var("i"), Var("j")), "f32"),
              Let("m", Op("gt", (Var("j"), Var("i")), "bool")),
              Let("w", Op("where", (Var("m"), Const(-3.4e38, "f32"), Const(0.0, "f32")), "f32")),
              Let("y", Op("add", (Var("x", "f32"), Var("w", "f32")), "f32")),
              Let("e", Op("exp", (Var("y", "f32"),), "f32")), Accum("a", "sum", Var("e", "f32")))
    assert _past_line(masked, past, lambda s: None, {})[0]


def test_a_transformers_model_masks_with_the_dtypes_minimum():
    """A Llama's eager attention adds the dtype's minimum above the diagonal (no predicate): its
    two layers' attentions run in pieces, and the logits match eager."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    from model_helpers import hf_model
    model = hf_model("llama", max_position_embeddings=256)
    ids = torch.randint(0, 96, (1, 150))
    prog, log = _compile(model, (ids,))
    assert log.count("causal_pieces:") == 2 and "150 queries in pieces of 64" in log
    got = prog(ids).double()
    with torch.no_grad():
        ref = model.double()(ids).logits
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < check.tolerance("f32", True), rel
