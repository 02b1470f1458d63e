"""Row softmax, one block per row: a strided max and sum, each reduced through shared memory
(a tree with barriers), then the normalised row written back."""
import torch

import strata as st

TOL = 1e-5


@st.kernel
def softmax(x, out, n_cols: int, BLOCK: st.constexpr):
    row = st.program_id(0)
    t = st.thread_id(0)
    part = st.shared((BLOCK,), st.float32)
    m = -float("inf")
    for c in range(t, n_cols, BLOCK):
        m = max(m, x[row, c])
    part[t] = m
    st.barrier()
    s = BLOCK // 2
    while s > 0:
        if t < s:
            part[t] = max(part[t], part[t + s])
        st.barrier()
        s = s // 2
    m = part[0]
    st.barrier()
    total = 0.0
    for c in range(t, n_cols, BLOCK):
        total += st.exp(x[row, c] - m)
    part[t] = total
    st.barrier()
    s = BLOCK // 2
    while s > 0:
        if t < s:
            part[t] = part[t] + part[t + s]
        st.barrier()
        s = s // 2
    total = part[0]
    for c in range(t, n_cols, BLOCK):
        out[row, c] = st.exp(x[row, c] - m) / total


def run(device: str, rows: int = 5, cols: int = 300):
    x = torch.randn(rows, cols)
    out = torch.empty_like(x)
    softmax[rows, 64](x, out, cols, BLOCK=64, device=device)
    return out, torch.softmax(x, dim=-1)


if __name__ == "__main__":       # python examples/kernels/softmax.py: check it here
    st.check_example(run, TOL)
