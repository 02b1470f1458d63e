"""The edges users hit, on every device: empty and size-1 tensors, a 0-d tensor, odd sizes,
integer and boolean data, one tensor updated in place."""
import numpy as np
import pytest
import torch

import strata as st

from dsl_devices import DEVICES


@st.kernel
def copy_scaled(x, out, n: int, s: float):
    i = st.program_id(0) * 32 + st.thread_id(0)
    if i < n:
        out[i] = x[i] * s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [0, 1, 31, 97])
def test_sizes(device, n):
    x, out = torch.randn(n), torch.full((n,), 7.0)
    copy_scaled[max(1, (n + 31) // 32), 32](x, out, n, 2.0, device=device)
    assert torch.equal(out, x * 2.0)


@st.kernel
def double_0d(x, out):
    if st.thread_id(0) == 0:
        out[0] = x[0] * 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim_tensors(device):
    x, out = torch.tensor(3.5), torch.tensor(0.0)
    double_0d[1, 1](x, out, device=device)
    assert out.shape == () and out.item() == 7.0
    a, b = np.array(3.5, dtype=np.float32), np.array(0.0, dtype=np.float32)   # 0-d NumPy too
    double_0d[1, 1](a, b, device=device)
    assert b.shape == () and b.item() == 7.0


@st.kernel
def count_true(flags, counts, n: int):
    i = st.thread_id(0)
    if i < n and flags[i]:
        st.atomic_add(counts, 0, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_bool_data_and_int_atomics(device):
    flags = torch.tensor([True, False, True, True, False])
    counts = torch.zeros(1, dtype=torch.int32)
    count_true[1, 8](flags, counts, 5, device=device)
    assert counts.item() == 3


@st.kernel
def add_one_in_place(x, n: int):
    i = st.thread_id(0)
    if i < n:
        x[i] = x[i] + 1


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_int64(device):
    x = torch.arange(10, dtype=torch.int64)
    add_one_in_place[1, 16](x, 10, device=device)
    assert torch.equal(x, torch.arange(1, 11))
