"""Malformed kernels are one sentence naming the user's file and line; the simulator's race,
out-of-bounds and divergent-barrier reports name the user's line too."""
import inspect

import pytest
import torch

import strata as st
from strata.core.errors import InputMismatch, KernelSyntaxError, SimError


def line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@st.kernel
def k_slice(x, out):
    out[0] = x[0:2]


@st.kernel
def k_bitwise(x, out):
    out[0] = x[0] & 1


@st.kernel
def k_unknown_call(x, out):
    out[0] = len(x)


@st.kernel
def k_index_scalar(x, out, n: int):
    out[0] = n[0]


@st.kernel
def k_return_value(x, out):
    return x[0]


@st.kernel
def k_float_loop(x, out):
    for i in range(0.5):
        out[0] = 1.0


@st.kernel
def k_assign_arg(x, out, n: int):
    n = 3
    out[0] = 1.0


@st.kernel
def k_undefined(x, out):
    out[0] = y


@st.kernel
def k_dims(x, out):
    out[0, 1, 2] = x[0]


@st.kernel
def k_try(x, out):
    try:
        out[0] = x[0]
    except Exception:
        pass


@st.kernel
def k_barrier_value(x, out):
    out[0] = st.barrier()


@st.kernel
def k_int_accumulator(x, out, n: int):
    total = 0
    for i in range(n):
        total += x[i]
    out[0] = total


@st.kernel
def k_shared_shape(x, out, n: int):
    s = st.shared((n,), st.float32)


CASES = [
    (k_slice, "out[0] = x[0:2]", "slices are not supported"),
    (k_bitwise, "x[0] & 1", "bitwise"),
    (k_unknown_call, "len(x)", "len(...) cannot be called in a kernel"),
    (k_index_scalar, "n[0]", "only tensors and shared arrays can be indexed"),
    (k_return_value, "return x[0]", "a kernel returns nothing"),
    (k_float_loop, "range(0.5)", "must be an integer"),
    (k_assign_arg, "n = 3", "n is a kernel argument"),
    (k_undefined, "out[0] = y", "y is not defined in the kernel"),
    (k_dims, "out[0, 1, 2]", "out has 1 dimensions but 3 indices"),
    (k_try, "try:", "`Try` statements are not supported"),
    (k_barrier_value, "st.barrier()", "st.barrier(...) is a statement, not a value"),
    (k_shared_shape, "st.shared((n,)", "must be a constant"),
    (k_int_accumulator, "total += x[i]", "total holds an integer and is assigned a float"),
]


@pytest.mark.parametrize("fn,text,why", CASES, ids=[c[0].__name__ for c in CASES])
def test_malformed_kernel_is_one_sentence_with_its_line(fn, text, why):
    x, out = torch.zeros(4), torch.zeros(4)
    args = (x, out, 4) if "n" in fn.signature.parameters else (x, out)
    with pytest.raises(KernelSyntaxError) as e:
        fn[1, 1](*args, device="sim")
    msg = str(e.value)
    assert msg.startswith(f"{__file__}:{line_of(fn, text)}: "), msg
    assert why in msg and "\n" not in msg


@st.kernel
def racy_reverse(x, out, BLOCK: st.constexpr):
    t = st.thread_id(0)
    buf = st.shared((BLOCK,), st.float32)
    buf[t] = x[t]
    out[t] = buf[BLOCK - 1 - t]


@st.kernel
def reverse(x, out, BLOCK: st.constexpr):
    t = st.thread_id(0)
    buf = st.shared((BLOCK,), st.float32)
    buf[t] = x[t]
    st.barrier()
    out[t] = buf[BLOCK - 1 - t]


def test_missing_barrier_is_a_race_at_the_users_line():
    x, out = torch.arange(64.0), torch.zeros(64)
    with pytest.raises(SimError, match=r"shared-memory race.*missing Sync.* at "
                       rf"test_errors.py:{line_of(racy_reverse, 'out[t] = buf')}: "):
        racy_reverse[1, 64](x, out, BLOCK=64, device="sim")
    for device in ("sim", "cpu"):           # with the barrier: right everywhere
        out = torch.zeros(64)
        reverse[1, 64](x, out, BLOCK=64, device=device)
        assert torch.equal(out, x.flip(0))


@st.kernel
def off_by_one(x, out, n: int):
    i = st.thread_id(0)
    if i <= n:
        out[i] = x[i] * 2.0


def test_out_of_bounds_names_the_users_line():
    x, out = torch.randn(31), torch.zeros(31)
    with pytest.raises(SimError, match=r"out-of-bounds load of x\[31\] \(size 31\) by block 0, "
                       rf"thread 31 at test_errors.py:{line_of(off_by_one, 'out[i] = x[i]')}: "):
        off_by_one[1, 32](x, out, 31, device="sim")


@st.kernel
def divergent(x, out):
    t = st.thread_id(0)
    if t < 16:
        st.barrier()
    out[t] = x[t]


def test_divergent_barrier_is_refused():
    with pytest.raises(KernelSyntaxError, match=r"test_errors.py:\d+: __syncthreads\(\) under thread-dependent control flow"):
        divergent[1, 32](torch.zeros(32), torch.zeros(32), device="sim")


def test_bad_launches_are_one_sentence():
    x = torch.zeros(4)
    with pytest.raises(InputMismatch, match=r"launched with a grid and a block"):
        reverse(x, x, BLOCK=4)
    with pytest.raises(InputMismatch, match=r"the block is a positive int"):
        reverse[1, 0](x, x, BLOCK=4)
    with pytest.raises(InputMismatch, match=r"at most 1024"):
        reverse[1, (64, 32)](x, x, BLOCK=4)
    with pytest.raises(InputMismatch, match=r"not contiguous"):
        reverse[1, 2](torch.zeros(4, 2).t(), torch.zeros(8), BLOCK=2, device="cpu")
    with pytest.raises(InputMismatch, match=r"argument x is a str"):
        reverse[1, 2]("x", x, BLOCK=2)
    with pytest.raises(InputMismatch, match=r"missing a required argument"):
        reverse[1, 2](x, BLOCK=2)
