"""Bugs the OpInfo sweep (tests/tensor/test_opinfo.py, docs/opinfo.md) found, each pinned by the
smallest program that showed it, through every stage and the simulator against eager float64
(the Tensor IR evaluator's are in tests/tensor/test_opinfo_found_eval.py)."""
import torch

from conftest import run_and_compare


def test_diff_with_n_zero_is_a_copy():
    # torch.diff(x, n=0) decomposes to zeros_like + aten.copy (the functional copy_): it was
    # "unsupported op aten.copy"
    run_and_compare(lambda x: torch.diff(x, n=0, dim=1), (torch.randn(5, 7),))
    run_and_compare(lambda x, p: torch.diff(x, n=0, dim=0, prepend=p),
                    (torch.randn(4, 3), torch.randn(2, 3)))


def test_copy_broadcasts_and_casts_into_the_destination():
    # the functional aten.copy: dst's shape and dtype, src's values (src broadcast)
    def f(x, y):
        return torch.ops.aten.copy(x, y)
    run_and_compare(f, (torch.zeros(3, 4, dtype=torch.int64), torch.randn(4) * 10))


def test_sign_of_bool():
    # torch.sign(bool) is the tensor itself; the evaluator and simulator raised a NumPy
    # UFuncTypeError (np.sign has no bool loop)
    run_and_compare(lambda x: torch.sign(x > 0), (torch.randn(5, 6),))
    run_and_compare(lambda m: torch.sign(m), (torch.randn(7) > 0,))


def test_integer_constants_wrap_like_eager():
    # full_like(uint8, -9) is 247 and add(alpha=-3) on uint8 multiplies by 253 in eager; the
    # constants reached the evaluator and simulator as -9 / -3 typed u8 (NumPy OverflowError)
    u8 = (torch.arange(12) % 7).to(torch.uint8).reshape(3, 4)
    run_and_compare(lambda x: torch.full_like(x, -9), (u8,))
    run_and_compare(lambda x, y: torch.add(x, y, alpha=-3), (u8, u8.flip(0)))


def test_expand_copy_broadcasts():
    # aten.expand_copy was lowered as a reshape: (5, 1, 5) -> (5, 3, 5) read the wrong elements
    run_and_compare(lambda x: torch.expand_copy(x, (5, 3, 5)), (torch.randn(5, 1, 5),))
    run_and_compare(lambda x: torch.expand_copy(x, (2, 4, 3)), (torch.randn(3),))


def test_reshape_of_an_empty_tensor():
    # unflatten (4, 0) -> (4, 0, 2): the reshape index of a zero extent raised IndexError
    run_and_compare(lambda x: x.unflatten(1, (0, 2)) + 1, (torch.randn(4, 0),))
    run_and_compare(lambda x: (x.reshape(3, 0, 2), x.sum()), (torch.randn(0, 6),))


def test_index_copy_into_a_0d_tensor():
    # a 0-d destination has one position; the scatter kernel indexed a dimension it lacks
    run_and_compare(lambda x, i, v: x.index_copy(0, i, v),
                    (torch.tensor(1.5), torch.tensor([0]), torch.tensor(-2.0)))


def test_true_divide_isneginf_and_diagonal():
    # logit / softplus(beta) decompose to aten.true_divide, nan_to_num to isposinf/isneginf,
    # einsum("ii->i") to aten.diagonal: each was "unsupported op"
    x = torch.tensor([[0.2, float("inf"), -float("inf")], [float("nan"), 0.7, -3.0]])
    run_and_compare(lambda t: torch.nan_to_num(t, nan=1.0, posinf=9.0, neginf=-9.0), (x,))
    run_and_compare(lambda t: torch.logit(t, eps=1e-3), (torch.rand(4, 5),))
    run_and_compare(lambda t: torch.nn.functional.softplus(t, beta=2.0), (torch.randn(9),))
    run_and_compare(lambda t: torch.einsum("ii->i", t), (torch.randn(4, 4),))
    run_and_compare(lambda t: t.diagonal(offset=-1, dim1=2, dim2=0), (torch.randn(4, 3, 5),))
    run_and_compare(lambda t: t.diagonal(offset=7), (torch.randn(4, 3),))


def test_a_complex_tensor_is_a_clear_error():
    # torch.polar returns complex64: dtypes.from_torch raised a bare ValueError
    import pytest
    import strata
    from strata.core.errors import UnsupportedDtype
    with pytest.raises(UnsupportedDtype, match="unsupported dtype torch.complex64"):
        strata.compile(lambda x: torch.polar(x, x), (torch.rand(3),))


def test_atleast_nd_of_several_tensors_and_meshgrid():
    # torch.atleast_2d(x, y, z) and torch.meshgrid (cartesian_prod) reach strata whole: they
    # were "unsupported op aten.atleast_2d / aten.meshgrid"
    run_and_compare(lambda x, y, z: torch.atleast_3d(x, y, z),
                    (torch.randn(3), torch.randn(()), torch.randn(2, 3)))
    run_and_compare(lambda x, y: torch.meshgrid(x, y, indexing="xy"),
                    (torch.randn(3), torch.randn(4)))
    run_and_compare(lambda x, y, z: torch.meshgrid(x, y, z, indexing="ij"),
                    (torch.randn(3), torch.randn(()), torch.randn(2)))
    run_and_compare(lambda x, y: torch.cartesian_prod(x, y), (torch.randn(3), torch.randn(4)))


def test_logsumexp_with_an_infinite_max():
    # torch shifts by 0 where the max is infinite; subtracting it gave inf - inf = NaN
    x = torch.randn(3, 5)
    x[0, 1], x[2, 0] = float("inf"), float("-inf")
    x[1] = float("-inf")
    run_and_compare(lambda t: torch.logsumexp(t, dim=1), (x,))
    run_and_compare(lambda t: torch.logsumexp(t, dim=(0, 1)), (x,))


def test_integer_pow_with_negative_exponents():
    # torch: x ** -n is 1 for x = 1, +-1 for x = -1, else 0; the evaluator and simulator raised
    # NumPy's "Integers to negative integer powers are not allowed" (2 ** t, x ** t on int64)
    b = torch.tensor([0, 1, -1, 2, -2, 3, 0, -1, -1, 5])
    e = torch.tensor([-1, -3, -3, -1, -2, -5, 0, -2, 0, 3])
    run_and_compare(lambda x, y: torch.pow(x, y), (b, e))
    run_and_compare(lambda y: 2 ** y, (e,))
    run_and_compare(lambda y: (-1) ** y, (e.to(torch.int32),))
    run_and_compare(lambda x, y: x ** y, (b.abs().to(torch.uint8), e.abs().to(torch.uint8)))


def test_all_and_any_of_uint8_are_uint8():
    # torch keeps uint8 for all/any of a uint8 tensor; the rule returned bool and decompose
    # stopped with an AssertionError (the type check against export's metadata)
    u8 = torch.tensor([[0, 3, 1], [2, 2, 0]], dtype=torch.uint8)
    run_and_compare(lambda x: (x.all(), x.any(dim=1), x.all(dim=0, keepdim=True)), (u8,))
