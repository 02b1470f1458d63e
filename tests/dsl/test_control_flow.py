"""Python control flow and values in kernels, against the same computation in Python, on the
simulator and natively on the CPU: break, continue, return, while, variables first set in a
branch, short-circuit and conditional expressions, shuffles, atomics, int64 and float64."""
import numpy as np
import pytest
import torch

import strata as st

from dsl_devices import DEVICES, OPENCL_MISSING


@st.kernel
def loops(x, out, n: int):
    t = st.thread_id(0)
    total = 0.0
    for i in range(n):
        if i == t:
            continue
        if x[i] < 0.0:
            break
        total += x[i]
    k = 0
    while k < t and k < n:
        k += 3
    out[t] = total + k


def test_break_continue_while():
    for device in ["sim", "cpu"] + ([] if OPENCL_MISSING else ["opencl"]):
        x = torch.tensor([1.0, 2.0, 3.0, -1.0, 5.0, 6.0])
        out = torch.zeros(8)
        loops[1, 8](x, out, 6, device=device)
        want = []
        for t in range(8):
            total = 0.0
            for i in range(6):
                if i == t:
                    continue
                if x[i] < 0:
                    break
                total += float(x[i])
            k = 0
            while k < t and k < 6:
                k += 3
            want.append(total + k)
        assert out.tolist() == want, device


@st.kernel
def early_return(x, out, n: int):
    i = st.program_id(0) * 16 + st.thread_id(0)
    if i >= n:
        return
    if x[i] > 0.0:
        y = x[i]
    else:
        y = -2.0 * x[i]
    out[i] = y if i % 2 == 0 else y + 100.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 17, 32])
def test_return_branches_and_ternary(device, n):
    x = torch.randn(n)
    out = torch.full((32,), 7.0)
    early_return[2, 16](x, out, n, device=device)
    y = torch.where(x > 0, x, -2.0 * x)
    y = torch.where(torch.arange(n) % 2 == 0, y, y + 100.0)
    assert torch.allclose(out[:n], y) and (out[n:] == 7.0).all()


@st.kernel
def guarded(x, out, n: int):
    i = st.thread_id(0)
    out[i] = 1 if i < n and x[i] > 0.5 else 0
    if i >= n or x[i] <= 0.5:
        out[i] += 10


@pytest.mark.parametrize("device", DEVICES)
def test_and_or_evaluate_their_second_operand_only_when_python_does(device):
    x = torch.tensor([0.1, 0.9, 0.7])            # 3 elements, 8 threads: x[i] for i >= 3 is
    out = torch.zeros(8, dtype=torch.int32)       # out of bounds, which the sim would report
    guarded[1, 8](x, out, 3, device=device)
    assert out.tolist() == [10, 1, 1, 10, 10, 10, 10, 10]


@st.kernel
def shuffles(x, out):
    t = st.thread_id(0)
    v = x[t]
    out[0, t] = st.shfl_xor(v, 5)
    out[1, t] = st.shfl(v, (t + 1) % 32)
    out[2, t] = st.warp_max(v)
    out[3, t] = st.warp_min(v)


@pytest.mark.parametrize("device", DEVICES)
def test_shuffles(device):
    x = torch.randn(64)
    out = torch.zeros(4, 64)
    shuffles[1, 64](x, out, device=device)
    lane = torch.arange(64)
    warp = x.view(2, 32)
    assert torch.equal(out[0], x[lane ^ 5])
    assert torch.equal(out[1], x[(lane // 32) * 32 + (lane + 1) % 32])
    assert torch.equal(out[2], warp.amax(1).repeat_interleave(32))
    assert torch.equal(out[3], warp.amin(1).repeat_interleave(32))


@st.kernel
def extremes(x, hi, lo, total, n: int):
    i = st.program_id(0) * 64 + st.thread_id(0)
    if i < n:
        st.atomic_max(hi, 0, x[i])
        st.atomic_min(lo, 0, x[i])
        st.atomic_add(total, 0, st.int64(1))


@pytest.mark.parametrize("device", DEVICES)
def test_atomics(device):
    n = 1000
    x = torch.randn(n)
    hi, lo = torch.full((1,), -1e30), torch.full((1,), 1e30)
    total = torch.zeros(1, dtype=torch.int64)
    extremes[16, 64](x, hi, lo, total, n, device=device)
    assert hi.item() == x.max().item() and lo.item() == x.min().item() and total.item() == n


@st.kernel
def wide(a, out, scale: float):
    i = st.thread_id(0)
    out[i] = a[i] * scale + st.float64(1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_float64_and_numpy_arrays(device):
    a = np.linspace(0, 1, 5)
    out = np.zeros(5)
    wide[1, 5](a, out, 3.0, device=device)
    assert np.allclose(out, a * 3.0 + 1e-12, rtol=1e-15, atol=0)


def test_specialisations_are_cached_and_printed():
    x = torch.zeros(3)
    out = torch.zeros(8)
    loops[1, 8](x, out, 3, device="sim")
    before = len(loops.cache)
    loops[1, 8](x, out, 2, device="sim")            # a runtime scalar: the same kernel
    assert len(loops.cache) == before
    loops[1, 8](torch.zeros(4), out, 2, device="sim")   # another shape: another kernel
    assert len(loops.cache) == before + 1
    assert "while" in loops.ir() and "n: i32" in loops.ir()
    assert "int n" in loops.source("cuda") and "strata_launch" in loops.source("c")


@st.kernel
def divide(a, b, q, r, fq, fr):
    i = st.thread_id(0)
    q[i] = a[i] // b[i]
    r[i] = a[i] % b[i]
    fq[i] = st.float32(a[i]) // 4.0
    fr[i] = (a[i] - 3) % 4


@pytest.mark.parametrize("device", DEVICES)
def test_integer_division_rounds_down_as_in_python(device):
    a = torch.tensor([7, -7, 7, -7, 0, 5, -1, 9], dtype=torch.int32)
    b = torch.tensor([2, 2, -2, -2, 3, -5, 4, 3], dtype=torch.int32)
    q, r = torch.zeros_like(a), torch.zeros_like(a)
    fq, fr = torch.zeros(8), torch.zeros_like(a)
    divide[1, 8](a, b, q, r, fq, fr, device=device)
    assert q.tolist() == [x // y for x, y in zip(a.tolist(), b.tolist())]
    assert r.tolist() == [x % y for x, y in zip(a.tolist(), b.tolist())]
    assert fq.tolist() == [float(x // 4.0) for x in a.tolist()]
    assert fr.tolist() == [(x - 3) % 4 for x in a.tolist()]
