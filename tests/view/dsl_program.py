"""A program with a `@strata.kernel` in it (through `st.custom_op`), for the view's tests and the
docs' screenshot: relu(x) + 1 fused by strata, then the hand-written RMSNorm, then * 2."""
import torch

import strata
import strata as st


@st.kernel
def rmsnorm(x, w, out, eps: float, COLS: st.constexpr):
    row = st.program_id(0)
    lane = st.thread_id(0)
    ss = 0.0
    for c in range(lane, COLS, 32):
        ss += x[row, c] * x[row, c]
    ss = st.warp_sum(ss)
    scale = st.rsqrt(ss / COLS + eps)
    for c in range(lane, COLS, 32):
        out[row, c] = x[row, c] * scale * w[c]


rms = st.custom_op("strata_view_test::rmsnorm", rmsnorm, grid=lambda x, w, eps: x.shape[0],
                   block=32, out_shape=lambda x, w, eps: x.shape, constexprs={"COLS": 96})


def program(device: str = "sim"):
    torch.manual_seed(0)
    w = torch.randn(96)

    def f(x):
        return rms(torch.relu(x) + 1.0, w, 1e-6) * 2.0
    return strata.compile(f, (torch.randn(7, 96),), device=device)
