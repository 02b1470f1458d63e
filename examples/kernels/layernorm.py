"""LayerNorm with a 2-D block: rows along y, threads of a row along x, the mean and variance
reduced by a tree in shared memory (one barrier per level)."""
import torch

import strata as st

TOL = 1e-5


@st.kernel
def layernorm(x, w, b, out, n_rows: int, n_cols: int, eps: float, THREADS: st.constexpr,
              ROWS: st.constexpr):
    t = st.thread_id(0)
    r = st.thread_id(1)
    row = st.program_id(0) * ROWS + r
    acc = st.shared((ROWS, THREADS), st.float32)
    part = 0.0
    if row < n_rows:
        for c in range(t, n_cols, THREADS):
            part += x[row, c]
    acc[r, t] = part
    st.barrier()
    s = THREADS // 2
    while s > 0:
        if t < s:
            acc[r, t] = acc[r, t] + acc[r, t + s]
        st.barrier()
        s //= 2
    mean = acc[r, 0] / n_cols
    st.barrier()
    part = 0.0
    if row < n_rows:
        for c in range(t, n_cols, THREADS):
            part += (x[row, c] - mean) * (x[row, c] - mean)
    acc[r, t] = part
    st.barrier()
    s = THREADS // 2
    while s > 0:
        if t < s:
            acc[r, t] = acc[r, t] + acc[r, t + s]
        st.barrier()
        s //= 2
    inv = st.rsqrt(acc[r, 0] / n_cols + eps)
    if row < n_rows:
        for c in range(t, n_cols, THREADS):
            out[row, c] = (x[row, c] - mean) * inv * w[c] + b[c]


def run(device: str, rows: int = 9, cols: int = 200):
    x, w, b = torch.randn(rows, cols), torch.randn(cols), torch.randn(cols)
    out = torch.empty_like(x)
    layernorm[(rows + 3) // 4, (32, 4)](x, w, b, out, rows, cols, 1e-5, THREADS=32, ROWS=4,
                                         device=device)
    ref = torch.nn.functional.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5)
    return out, ref


if __name__ == "__main__":       # python examples/kernels/layernorm.py: check it here
    st.check_example(run, TOL)
