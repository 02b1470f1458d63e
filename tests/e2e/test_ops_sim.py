"""Every op in scope, through all six stages and the simulator, against eager in float64.

Shapes are deliberately awkward: odd, prime, size 1, not multiples of a block."""
import pytest
import torch
import torch.nn.functional as F

from conftest import run_and_compare

r = torch.randn


def pos(*s):
    return torch.rand(*s) + 0.1


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2,
    "log": lambda x: torch.log(x.abs() + 0.1), "log1p": lambda x: torch.log1p(x.abs()),
    "expm1": torch.expm1, "sqrt": lambda x: torch.sqrt(x.abs()), "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "reciprocal": lambda x: torch.reciprocal(x.abs() + 0.5), "square": torch.square,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "erf": torch.erf, "sin": torch.sin, "cos": torch.cos, "floor": lambda x: torch.floor(x * 3),
    "ceil": lambda x: torch.ceil(x * 3), "round": lambda x: torch.round(x * 3),
    "trunc": lambda x: torch.trunc(x * 3), "sign": torch.sign,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.7), "clamp_min": lambda x: x.clamp(min=0.1),
    "pow_scalar": lambda x: torch.pow(x.abs(), 1.7), "pow_int": lambda x: x ** 3,
    "logical_not": lambda x: torch.logical_not(x > 0),
    "to_int": lambda x: (x * 10).to(torch.int32), "cast_roundtrip_f16": lambda x: x.half().float(),
    "cast_roundtrip_bf16": lambda x: x.bfloat16().float(),
}

BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "minimum": torch.minimum, "maximum": torch.maximum, "pow": lambda a, b: torch.pow(a.abs() + 0.1, b),
    "eq": lambda a, b: a.round() == b.round(), "ne": lambda a, b: a.round() != b.round(),
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": lambda a, b: (a > 0) & (b > 0), "logical_or": lambda a, b: (a > 0) | (b > 0),
    "logical_xor": lambda a, b: torch.logical_xor(a > 0, b > 0),
    "where": lambda a, b: torch.where(a > b, a, b), "masked_fill": lambda a, b: a.masked_fill(b > 0, -1.5),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "add_scalar": lambda a, b: a + 2.5 * b - 1,
}

SHAPES = [(7, 33), (1,), (5, 1, 17), (1009,)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name, shape):
    run_and_compare(UNARY[name], (r(*shape),))


@pytest.mark.parametrize("shape", [(7, 33), (3, 1, 5)], ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name, shape):
    run_and_compare(BINARY[name], (r(*shape), r(*shape)))


def test_broadcasting():
    run_and_compare(lambda a, b, c: a * b + c, (r(4, 1, 6), r(5, 1), r(6)))


REDUCTIONS = {
    "sum_last": lambda x: x.sum(-1), "sum_first": lambda x: x.sum(0), "sum_mid_keep": lambda x: x.sum(1, keepdim=True),
    "sum_axes": lambda x: x.sum((0, 2)), "sum_all": lambda x: x.sum(),
    "mean": lambda x: x.mean(-1), "mean_axes": lambda x: x.mean((0, 1)),
    "amax": lambda x: x.amax(-1), "amin_first": lambda x: x.amin(0), "prod": lambda x: (x * 0.3 + 1).prod(-1),
    "var": lambda x: x.var(-1), "var_biased": lambda x: x.var(1, unbiased=False), "std": lambda x: x.std(0),
    "argmax": lambda x: x.argmax(-1), "argmin_first": lambda x: x.argmin(0), "argmax_all": lambda x: x.argmax(),
    "softmax": lambda x: torch.softmax(x, -1), "softmax_first": lambda x: torch.softmax(x, 0),
    "log_softmax": lambda x: torch.log_softmax(x, -1), "logsumexp": lambda x: torch.logsumexp(x, -1),
    "normalize": lambda x: F.normalize(x, dim=-1), "max_dim": lambda x: x.max(-1).values,
    "cumsum": lambda x: x.cumsum(-1), "cumsum_first": lambda x: (x > 0).cumsum(0),
    "diff": lambda x: torch.diff(x, dim=-1, prepend=x[..., :1]),
}


@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 1, 129), (2, 9, 1)], ids=str)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions(name, shape):
    run_and_compare(REDUCTIONS[name], (r(*shape),))


def test_rms_norm_module():
    prog = run_and_compare(torch.nn.RMSNorm(2048), (r(1, 32, 2048),))
    assert len(prog.kernels) == 1


def test_layer_norm_affine_and_plain():
    run_and_compare(torch.nn.LayerNorm(257), (r(3, 257),))
    run_and_compare(torch.nn.LayerNorm((4, 33), elementwise_affine=False), (r(2, 4, 33),))


def test_residual_rms_norm_is_one_kernel():
    norm = torch.nn.RMSNorm(64)

    def block(x, res):
        h = x + res
        return norm(h), h
    prog = run_and_compare(block, (r(2, 5, 64), r(2, 5, 64)))
    assert len(prog.kernels) == 1


LAYOUT = {
    "view": lambda x: x.view(6, 35) * 2, "reshape": lambda x: x.reshape(5, 42).exp(),
    "permute": lambda x: x.permute(2, 0, 1) + 1, "transpose": lambda x: x.transpose(0, 2).contiguous(),
    "expand": lambda x: x[:, :1].expand(6, 4, 7) * 1, "unsqueeze": lambda x: x.unsqueeze(1) * 3,
    "squeeze": lambda x: x[:, :1].squeeze(1) + 1, "slice_step": lambda x: x[::2, 1:6:3] * 2,
    "select": lambda x: x.select(1, 3) + 1, "narrow": lambda x: x.narrow(2, 2, 4) - 1,
    "cat": lambda x: torch.cat([x, x * 2], 1), "stack": lambda x: torch.stack([x, -x], 0),
    "flip": lambda x: x.flip(0, 2) * 1, "roll": lambda x: torch.roll(x, 3, 2) + 0,
    "roll_neg": lambda x: torch.roll(x, -2, 0) * 1, "repeat": lambda x: x.repeat(2, 1, 3),
    "triu": lambda x: torch.triu(x[0]), "tril_k": lambda x: torch.tril(x[0], -1),
    "clone": lambda x: x.clone() + 0,
}


@pytest.mark.parametrize("name", list(LAYOUT))
def test_layout(name):
    run_and_compare(LAYOUT[name], (r(6, 5, 7),))


def test_embedding_and_gathers():
    emb = torch.nn.Embedding(50, 16)
    ids = torch.randint(0, 50, (3, 7))
    run_and_compare(emb, (ids,))
    x = r(6, 9)
    run_and_compare(lambda x, i: torch.index_select(x, 1, i), (x, torch.randint(0, 9, (4,))))
    run_and_compare(lambda x, i: torch.gather(x, 1, i), (x, torch.randint(0, 9, (6, 3))))


def test_index_with_several_tensors():
    """x[i, j] and x[i, :, j] (the reads Hugging Face mask builders make), negative indices too."""
    x = r(5, 6, 7)
    i, j = torch.randint(-5, 5, (3, 1)), torch.randint(-7, 7, (4,))
    run_and_compare(lambda x, i, j: (x[i, :, j], x[:, i % 5, j], x[i, i % 6]), (x, i, j))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision(dtype):
    run_and_compare(lambda x, w: torch.softmax(x * w, -1), (r(5, 77).to(dtype), r(77).to(dtype)))
    run_and_compare(torch.nn.RMSNorm(96).to(dtype), (r(3, 96).to(dtype),))
    run_and_compare(lambda x: F.silu(x) + x.float().to(dtype), (r(1000).to(dtype),))


def test_matmul_seed_example():
    prog = run_and_compare(lambda x, b, w: torch.relu(torch.matmul(x + b, w)),
                           (r(16, 64), r(64), r(64, 16)), contraction=True)
    assert len(prog.kernels) == 1
    assert "Tile(matmul=" in prog.ir("tile") and "StageTile(" in prog.ir("tile")


@pytest.mark.slow
def test_large_elementwise_and_reduction():
    run_and_compare(lambda x: torch.sigmoid(x) * x, (r(1 << 20 | 3),))
    run_and_compare(lambda x: x.sum(), (r(1 << 20),))
