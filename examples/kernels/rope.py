"""Rotary embedding (the half-split form of Llama) on a [tokens, heads, dim] tensor: a 2-D grid
of (token, head), one thread per rotated pair."""
import torch

import strata as st

TOL = 1e-5


@st.kernel
def rope(q, cos, sin, out, HALF: st.constexpr):
    tok = st.program_id(0)
    head = st.program_id(1)
    i = st.thread_id(0)
    if i < HALF:
        a = q[tok, head, i]
        b = q[tok, head, i + HALF]
        out[tok, head, i] = a * cos[tok, i] - b * sin[tok, i]
        out[tok, head, i + HALF] = b * cos[tok, i + HALF] + a * sin[tok, i + HALF]


def run(device: str, tokens: int = 5, heads: int = 3, dim: int = 48):
    q = torch.randn(tokens, heads, dim)
    angle = torch.arange(tokens)[:, None] * 10000.0 ** (-torch.arange(dim // 2) / (dim // 2))
    angle = torch.cat([angle, angle], -1)
    cos, sin = angle.cos(), angle.sin()
    out = torch.empty_like(q)
    rope[(tokens, heads), 32](q, cos, sin, out, HALF=dim // 2, device=device)
    qd = q.double()
    rotated = torch.cat([-qd[..., dim // 2:], qd[..., :dim // 2]], -1)
    return out, qd * cos.double()[:, None] + rotated * sin.double()[:, None]


if __name__ == "__main__":       # python examples/kernels/rope.py: check it here
    st.check_example(run, TOL)
