"""View, slice, concatenation and gather ops through Tensor IR vs torch eager."""
import numpy as np
import torch
import torch.nn.functional as F

from strata.core.expr import Var, add, evaluate, floordiv, mod, mul, to_str
from strata.frontend.capture import capture
from strata.tensor.decompose import to_tensor_ir
from strata.tensor.ir import IndexMap
from tensor_helpers import check_cases, rnd


def test_views():
    x = rnd(2, 3, 5)
    check_cases({
        "view": (lambda x: (x.view(6, 5), x.reshape(-1), x.reshape(5, 3, 2), x.view(2, 15)), (x,)),
        "view2": (lambda x: x.reshape(3, 10).reshape(30).reshape(2, 3, 5) * 2, (x,)),
        "permute": (lambda x: (x.permute(2, 0, 1), x.permute(1, 2, 0).reshape(15, 2)), (x,)),
        "transpose": (lambda x: (x.transpose(0, 2), x.transpose(-1, -2), x[0].t(), x.mT), (x,)),
        "expand": (lambda x: (x[:, :1].expand(2, 4, 5), x.expand(3, 2, 3, 5), x[0, 0].expand_as(x)), (x,)),
        "unsqueeze": (lambda x: (x.unsqueeze(0), x.unsqueeze(-1), x[:, None, :, None]), (x,)),
        "squeeze": (lambda x: (x[:, :1].squeeze(), x[:1].squeeze(0), x[:, :1, :1].squeeze((1, 2))), (x,)),
        "flatten": (lambda x: (x.flatten(), x.flatten(1), x.movedim(0, -1)), (x,)),
        "contig": (lambda x: (x.transpose(0, 1).contiguous(), x.clone(), x.detach()), (x,)),
    })


def test_slicing():
    x = rnd(7, 6, 5)
    check_cases({
        "slice": (lambda x: (x[1:5], x[:, ::2], x[..., 1::3], x[-3:], x[:, -5:-1:2], x[2:100]), (x,)),
        "select": (lambda x: (x[3], x[:, -1], x[..., 0], x.select(1, 2)), (x,)),
        "narrow": (lambda x: (x.narrow(0, 2, 3), x.narrow(-1, -2, 2)), (x,)),
        "flip": (lambda x: (x.flip(0), x.flip(-1, 1)), (x,)),
        "roll": (lambda x: (x.roll(2, 0), x.roll(-3, -1), x.roll((1, 9), (1, 2)), x.roll(4)), (x,)),
        "repeat": (lambda x: (x.repeat(2, 1, 3), x[0].repeat(2, 1, 1)), (x,)),
        "tri": (lambda x: (x.triu(), x.tril(), x.triu(2), x.tril(-1), x[0].triu(-2)), (x,)),
        "chunk": (lambda x: (*x.chunk(3, 0), *x.split([2, 4], 1), *x.unbind(2)), (x,)),
    })


def test_cat_stack():
    a, b, c = rnd(3, 4), rnd(3, 2), rnd(3, 1)
    check_cases({
        "cat1": (lambda a, b, c: torch.cat([a, b, c], 1), (a, b, c)),
        "cat0": (lambda a, b: torch.cat([a.t(), b.t()], 0), (a, b)),
        "cat_neg": (lambda a, b: torch.cat([a, b, a], -1), (a, b)),
        "cat_int": (lambda a, b: torch.cat([a, b.int()], 1), (a, b)),
        "stack": (lambda a: (torch.stack([a, a * 2], 0), torch.stack([a, -a, a], 2),
                             torch.stack([a, a], -2)), (a,)),
    })


def test_gathers():
    w = rnd(11, 4)
    ids = torch.randint(0, 11, (2, 5))
    x = rnd(4, 7)
    g = torch.randint(0, 7, (4, 3))
    check_cases({
        "embedding": (lambda w, ids: F.embedding(ids, w), (w, ids)),
        "embedding_mod": (torch.nn.Embedding(11, 4), (ids,)),
        "index_select": (lambda x, i: (x.index_select(1, i), x.index_select(0, i[:2] % 4)), (x, g[0].clone())),
        "gather": (lambda x, i: (torch.gather(x, 1, i), torch.gather(x, 0, i[:2] % 4)), (x, g)),
        "index": (lambda x, i: (x[i[0] % 4], x[:, i], x[:, i - 7]), (x, g)),
        "index_2": (lambda x, i: (x[i % 4, i], x[i[:1] % 4 - 4, i[:, :1] - 7], x[i[0] % 4, i[0]]),
                    (x, g)),
        "index_gap": (lambda y, i: (y[i % 3, :, i % 5], y[:, i % 4, i % 5], y[..., i % 4, i]),
                      (rnd(3, 4, 5, 7), g)),
    })


def test_view_chain_simplifies():
    """reshape of reshape composes into one IndexMap without // or % left."""
    prog = to_tensor_ir(capture(lambda x: x.reshape(6, 35).reshape(2, 3, 5, 7).permute(0, 1, 3, 2) + 1,
                                (rnd(2, 3, 5, 7),)))
    maps = [n for n in prog.nodes if isinstance(n, IndexMap)]
    assert len(maps) == 1
    text = str(prog)
    assert "//" not in text and "%" not in text, text


def test_a_block_inside_a_block_simplifies_exactly():
    """(32 o + i) // 256 with i < 32 is o // 8 (a K-quant's super-block index inside its blocks of
    32), and its remainder (o % 8) * 32 + i; both checked against NumPy over every value."""
    x = add(mul(Var("o", "i64"), 32), Var("i", "i64"))
    bounds = {"o": 40, "i": 32}
    div, rem = floordiv(x, 256, bounds), mod(x, 256, bounds)
    assert to_str(div) == "o // 8" and to_str(rem) == "o % 8 * 32 + i", (to_str(div), to_str(rem))
    o, i = np.meshgrid(np.arange(40), np.arange(32))
    env = {"o": o, "i": i}
    assert np.array_equal(evaluate(div, env), (32 * o + i) // 256)
    assert np.array_equal(evaluate(rem, env), (32 * o + i) % 256)
    assert "//" in to_str(floordiv(add(mul(Var("o", "i64"), 32), Var("i", "i64")), 256,
                                   {"o": 40, "i": 33}))      # i may reach 32: no split
