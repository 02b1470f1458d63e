"""A histogram with atomics: each thread adds 1 to its value's bin, first in a per-block shared
histogram, then one global atomic per bin and block."""
import torch

import strata as st

TOL = 0.0


@st.kernel
def histogram(x, counts, n: int, BINS: st.constexpr, BLOCK: st.constexpr):
    t = st.thread_id(0)
    local = st.shared((BINS,), st.int32)
    for b in range(t, BINS, BLOCK):
        local[b] = 0
    st.barrier()
    i = st.program_id(0) * BLOCK + t
    if i < n:
        st.atomic_add(local, x[i], 1)
    st.barrier()
    for b in range(t, BINS, BLOCK):
        st.atomic_add(counts, b, local[b])


def run(device: str, n: int = 1000, bins: int = 10):
    x = torch.randint(0, bins, (n,), dtype=torch.int32)
    counts = torch.zeros(bins, dtype=torch.int32)
    histogram[(n + 127) // 128, 128](x, counts, n, BINS=bins, BLOCK=128, device=device)
    return counts, torch.bincount(x.long(), minlength=bins).int()


if __name__ == "__main__":       # python examples/kernels/histogram.py: check it here
    st.check_example(run, TOL)
