"""`k[grid, block](..., checked=True)`: native launches (C, OpenCL) find the out-of-bounds
accesses the simulator finds, as the same one sentence naming the user's line, without reading or
writing outside the buffers; in-bounds kernels give the same results checked or not."""
import pytest
import torch

import strata as st
from strata.core.errors import SimError

from dsl_devices import DEVICES
from test_errors import line_of

NATIVE = [d for d in DEVICES if getattr(d, "values", (d,))[0] != "sim"]


@st.kernel
def off_by_one(x, out, n: int):
    i = st.thread_id(0)
    if i <= n:
        out[i] = x[i] * 2.0


@st.kernel
def shifted_store(x, out, shift: int):
    i = st.thread_id(0)
    out[i + shift] = x[i]


@st.kernel
def gather(x, idx, out):
    i = st.thread_id(0)
    out[i] = x[idx[i]]


@st.kernel
def shared_overflow(x, out, BLOCK: st.constexpr):
    t = st.thread_id(0)
    buf = st.shared((BLOCK,), st.float32)
    buf[t + 1] = x[t]
    st.barrier()
    out[t] = buf[t]


@st.kernel
def find_first_zero(x, out):
    k = 0
    while x[k] != 0.0:          # runs past the end when x has no zero
        k += 1
    out[0] = k


@st.kernel
def block_reverse(x, out, BLOCK: st.constexpr):
    t = st.thread_id(0)
    base = st.program_id(0) * BLOCK
    buf = st.shared((BLOCK,), st.float32)
    buf[t] = x[base + t]
    st.barrier()
    out[base + t] = buf[BLOCK - 1 - t]


@pytest.mark.parametrize("device", NATIVE)
def test_a_load_past_the_end_is_the_simulators_sentence(device):
    x, out = torch.randn(31), torch.zeros(31)
    line = line_of(off_by_one, "out[i] = x[i]")
    with pytest.raises(SimError, match=rf"^off_by_one: out-of-bounds load of x\[31\] \(size 31\) "
                       rf"at test_checked_launch.py:{line}: out\[i\] = x\[i\] \* 2.0\.$"):
        off_by_one[1, 32](x, out, 31, device=device, checked=True)
    assert torch.equal(out[:31], x * 2)           # the in-bounds threads still ran


@pytest.mark.parametrize("device", NATIVE)
def test_an_unchecked_launch_does_not_see_it(device):
    """What checked=True is for: the same launch natively without it raises nothing."""
    x, out = torch.randn(31), torch.zeros(31)
    off_by_one[1, 32](x, out, 30, device=device)      # in bounds: fine either way
    off_by_one[1, 32](x, out, 30, device=device, checked=True)
    assert torch.equal(out, x * 2)


@pytest.mark.parametrize("device", NATIVE)
@pytest.mark.parametrize("shift, index", [(1, 8), (-1, -1)])
def test_a_stray_store_is_refused_and_writes_nothing(device, shift, index):
    x = torch.arange(8, dtype=torch.float32) + 1
    out = torch.zeros(8)
    with pytest.raises(SimError, match=rf"out-of-bounds store of out\[{index}\] \(size 8\)"):
        shifted_store[1, 8](x, out, shift, device=device, checked=True)
    expected = torch.zeros(8)
    if shift > 0:
        expected[1:] = x[:7]
    else:
        expected[:7] = x[1:]
    assert torch.equal(out, expected)             # the stray store went nowhere


@pytest.mark.parametrize("device", NATIVE)
def test_an_index_read_from_memory_is_checked(device):
    x, out = torch.randn(5), torch.zeros(4)
    idx = torch.tensor([0, 4, 5, 2], dtype=torch.int32)
    with pytest.raises(SimError, match=r"out-of-bounds load of x\[5\] \(size 5\)"):
        gather[1, 4](x, idx, out, device=device, checked=True)
    idx[2] = 3
    gather[1, 4](x, idx, out, device=device, checked=True)
    assert torch.equal(out, x[idx.long()])


@pytest.mark.parametrize("device", NATIVE)
def test_shared_memory_is_checked(device):
    x, out = torch.randn(16), torch.zeros(16)
    with pytest.raises(SimError, match=r"out-of-bounds store of buf\[16\] \(size 16\)"):
        shared_overflow[1, 16](x, out, BLOCK=16, device=device, checked=True)


@pytest.mark.parametrize("device", NATIVE)
def test_a_while_condition_is_checked_on_every_pass(device):
    out = torch.zeros(1, dtype=torch.int32)
    find_first_zero[1, 1](torch.tensor([3.0, 1.0, 0.0, 5.0]), out, device=device, checked=True)
    assert out.item() == 2
    with pytest.raises(SimError, match=r"out-of-bounds load of x\[3\] \(size 3\) at "
                       r"test_checked_launch.py:\d+: while x\[k\] != 0.0"):
        find_first_zero[1, 1](torch.ones(3), out, device=device, checked=True)


@pytest.mark.parametrize("device", NATIVE)
@pytest.mark.parametrize("blocks", [1, 3])
def test_checked_and_unchecked_agree_in_bounds(device, blocks):
    x = torch.randn(blocks * 32)
    plain, checked = torch.zeros_like(x), torch.zeros_like(x)
    block_reverse[blocks, 32](x, plain, BLOCK=32, device=device)
    block_reverse[blocks, 32](x, checked, BLOCK=32, device=device, checked=True)
    assert torch.equal(plain, checked)
    assert torch.equal(checked, x.view(blocks, 32).flip(1).reshape(-1))


def test_the_checked_source_guards_every_access():
    from strata.kernel_ir.bounds_check import FAULT, add_bounds_checks
    x, idx, out = torch.randn(5), torch.zeros(4, dtype=torch.int32), torch.zeros(4)
    k, sites = add_bounds_checks(gather.kernel_ir((x, idx, out), grid=1, block=4))
    assert [(s.what, s.buf, s.size) for s in sites] == [
        ("load", "idx", 4), ("load", "x", 5), ("store", "out", 4)]
    assert k.params[-1].name == FAULT and k.params[-1].output
    assert all(s.where.startswith("test_checked_launch.py:") for s in sites)
