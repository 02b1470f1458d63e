"""Reductions and normalisations through Tensor IR vs torch eager, over every axis pattern."""
import pytest
import torch
import torch.nn.functional as F

from tensor_helpers import check_cases, rnd

SHAPES = [(7,), (3, 1, 5), (2, 3, 4, 5)]


def _dims(rank):
    """A few axis sets per rank: last, first, negative, several, all."""
    out = [-1, 0, None]
    if rank >= 2:
        out += [(0, -1), (1,)]
    if rank >= 3:
        out += [(0, 2), (1, 2)]
    return out


def _reduce_cases(shape):
    x = rnd(*shape)
    cases = {}
    for dim in _dims(len(shape)):
        d = dim if dim is not None else tuple(range(len(shape)))
        cases[f"sum{dim}"] = (lambda x, d=d: (x.sum(d), x.sum(d, keepdim=True)), (x,))
        cases[f"mean{dim}"] = (lambda x, d=d: (x.mean(d), x.mean(d, keepdim=True)), (x,))
        cases[f"amax{dim}"] = (lambda x, d=d: (x.amax(d), x.amin(d, keepdim=True)), (x,))
        cases[f"var{dim}"] = (lambda x, d=d: (x.var(d), x.var(d, correction=0, keepdim=True),
                                              x.std(d), x.std(d, unbiased=False)), (x,))
        cases[f"logsumexp{dim}"] = (lambda x, d=d: torch.logsumexp(x, d), (x,))
        cases[f"norm{dim}"] = (lambda x, d=d: (torch.linalg.vector_norm(x, dim=d),
                                               torch.linalg.vector_norm(x, 1, dim=d),
                                               torch.linalg.vector_norm(x, float("inf"), dim=d),
                                               torch.linalg.vector_norm(x, 3, dim=d, keepdim=True)),
                               (x,))
    for dim in (0, -1):
        cases[f"prod{dim}"] = (lambda x, d=dim: (x.prod(d), x.prod(d, keepdim=True)), (x,))
        cases[f"argmax{dim}"] = (lambda x, d=dim: (x.argmax(d), x.argmin(d, keepdim=True)), (x,))
        cases[f"maxdim{dim}"] = (lambda x, d=dim: (*x.max(d), *x.min(d, keepdim=True)), (x,))
        cases[f"softmax{dim}"] = (lambda x, d=dim: (torch.softmax(x, d), F.log_softmax(x, d)), (x,))
        cases[f"normalize{dim}"] = (lambda x, d=dim: (F.normalize(x, dim=d), F.normalize(x, p=1, dim=d)),
                                    (x,))
    cases["all"] = (lambda x: (x.sum(), x.mean(), x.max(), x.min(), x.argmax(), x.argmin(),
                               x.prod(), x.argmax(keepdim=True)), (x,))
    cases["any"] = (lambda x: ((x > 0).any(), (x > 0).all(-1), (x > 1).any(0, keepdim=True)), (x,))
    return cases


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reductions(shape):
    check_cases(_reduce_cases(shape))


def test_int_and_bool_reductions():
    i = torch.randint(-4, 5, (3, 7))
    check_cases({"int": (lambda i: (i.sum(), i.sum(1), (i > 0).sum(0), i.amax(1), i.argmax(1),
                                    i.prod(0), i.float().mean(1)), (i,)),
                 "dtype": (lambda x: x.sum(1, dtype=torch.float64), (rnd(3, 4),))})


def test_cumsum_and_diff():
    x = rnd(3, 5, 4)
    i = torch.randint(-4, 5, (2, 6))
    check_cases({"cumsum": (lambda x: (x.cumsum(-1), x.cumsum(0), x.cumsum(1, dtype=torch.float64),
                                       x[0, 0, 0].cumsum(0)), (x,)),
                 "cumsum_int": (lambda i: (i.cumsum(1), (i != 1).cumsum(-1)), (i,)),
                 "diff": (lambda x: (torch.diff(x), torch.diff(x, dim=0, append=x[:1]),
                                     torch.diff(x, n=2, dim=1)), (x,))})


def test_argmax_first_occurrence():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    check_cases({"ties": (lambda x: (x.argmax(1), x.argmin(1), x.argmax(), x.max(1).indices), (x,))})


NORM_SHAPES = [((1, 32, 64), (64,)), ((3, 5, 7), (5, 7)), ((4, 1), (1,)), ((13,), (13,))]


@pytest.mark.parametrize("shape,ns", NORM_SHAPES, ids=str)
def test_norms(shape, ns):
    x, w, b = rnd(*shape), rnd(*ns), rnd(*ns)
    check_cases({
        "rms": (lambda x: F.rms_norm(x, ns), (x,)),
        "rms_w": (lambda x, w: F.rms_norm(x, ns, w, eps=1e-6), (x, w)),
        "ln": (lambda x: F.layer_norm(x, ns), (x,)),
        "ln_wb": (lambda x, w, b: F.layer_norm(x, ns, w, b, eps=1e-3), (x, w, b)),
        "ln_w": (lambda x, w: F.layer_norm(x, ns, w), (x, w)),
        "native": (lambda x, w, b: torch.native_layer_norm(x, ns, w, b, 1e-5), (x, w, b)),
    })


def test_modules():
    torch.manual_seed(1)
    ln, rms, sm = torch.nn.LayerNorm(6), torch.nn.RMSNorm([3, 6]), torch.nn.Softmax(dim=1)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    check_cases({"ln": (ln, (rnd(2, 3, 6),)), "rms": (rms, (rnd(2, 3, 6),)),
                 "softmax": (sm, (rnd(2, 9, 3),)), "var_mean": (lambda x: torch.var_mean(x, 1), (rnd(3, 4),)),
                 "cosine": (lambda x, y: F.cosine_similarity(x, y, dim=1), (rnd(3, 4), rnd(3, 4)))})


def test_reductions_over_axes_of_one_element_fuse():
    """A row of one element (softmax over (1, 32, 1, 1), a decode step's scores) has no loop to
    recompute an inner reduction in: one kernel, not one per reduction; a layer norm of one
    element returns its mean and rstd beside its output from that kernel."""
    import strata
    from strata.bench import cases
    case = cases.cases(models=("tinyllama",), seqs=(1,), dtypes=("f32",), ops=("softmax",))[0]
    module, inputs = case.build("cpu")                                 # the op suite's case
    assert len(strata.compile(module, inputs, device="cpu").kernels) == 1
    x = torch.tensor([[[float("inf")]], [[float("nan")]], [[-2.5]], [[0.0]]])
    prog = strata.compile(lambda x: (torch.softmax(x, -1), x.sum(1), x.amax((1, 2))), (x,))
    for got, want in zip(prog(x), (torch.softmax(x, -1), x.sum(1), x.amax((1, 2)))):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    check_cases({"layer_norm_of_one": (lambda x, w, b: torch.native_layer_norm(x, [1], w, b, 1e-5),
                                       (rnd(1), rnd(1), rnd(1)))})
