"""RMSNorm, one warp per row: each lane sums squares over a strided slice, st.warp_sum
combines the 32 partial sums through shuffles (no shared memory, no barrier)."""
import torch

import strata as st

TOL = 1e-5


@st.kernel
def rmsnorm(x, w, out, n_cols: int, eps: float):
    row = st.program_id(0)
    lane = st.thread_id(0)
    ss = 0.0
    for c in range(lane, n_cols, 32):
        ss += x[row, c] * x[row, c]
    ss = st.warp_sum(ss)
    scale = st.rsqrt(ss / n_cols + eps)
    for c in range(lane, n_cols, 32):
        out[row, c] = x[row, c] * scale * w[c]


def run(device: str, rows: int = 7, cols: int = 131):
    x, w = torch.randn(rows, cols), torch.randn(cols)
    out = torch.empty_like(x)
    rmsnorm[rows, 32](x, w, out, cols, 1e-6, device=device)
    xd = x.double()
    return out, xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()


if __name__ == "__main__":       # python examples/kernels/rmsnorm.py: check it here
    st.check_example(run, TOL)
