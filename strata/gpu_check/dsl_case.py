"""The acceptance run's `@strata.kernel` case: RMSNorm with a block-wide sum of squares through
shared memory (a tree with barriers), the pattern racecheck exists for."""
from __future__ import annotations

import torch

import strata as st

BLOCK = 128


@st.kernel
def block_rmsnorm(x, w, out, n_cols: int, eps: float, B: st.constexpr):
    row = st.program_id(0)
    t = st.thread_id(0)
    part = st.shared((B,), st.float32)
    ss = 0.0
    for c in range(t, n_cols, B):
        ss += x[row, c] * x[row, c]
    part[t] = ss
    st.barrier()
    s = B // 2
    while s > 0:
        if t < s:
            part[t] = part[t] + part[t + s]
        st.barrier()
        s = s // 2
    scale = st.rsqrt(part[0] / n_cols + eps)
    for c in range(t, n_cols, B):
        out[row, c] = x[row, c] * scale * w[c]


def block_rmsnorm_check(device: str, rows: int = 6, cols: int = 517) -> str:
    """'' when the kernel matches float64 torch within 1e-5 on `device`, else why not."""
    torch.manual_seed(0)
    x, w = torch.randn(rows, cols), torch.randn(cols)
    out = torch.full_like(x, float("nan"))
    if device == "cuda":
        x, w, out = x.cuda(), w.cuda(), out.cuda()
    block_rmsnorm[rows, BLOCK](x, w, out, cols, 1e-6, B=BLOCK, device=device)
    xd, wd = x.double().cpu(), w.double().cpu()
    want = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd
    got = out.double().cpu()
    rel = float((got - want).norm() / want.norm())
    return "" if rel < 1e-5 else f"rel err {rel:.3g} (tol 1e-05)"
