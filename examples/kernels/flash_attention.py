"""Flash attention (causal), one thread per query: K and V tiles of BLOCK_N keys staged in shared
memory by the whole block, an online softmax per query (running max m and sum l), the output
accumulated in a shared row per thread and divided by l at the end: no seq x seq matrix."""
import math

import torch

import strata as st

TOL = 1e-5


@st.kernel
def flash_attention(q, k, v, out, seq: int, scale: float, D: st.constexpr, BLOCK_M: st.constexpr,
                    BLOCK_N: st.constexpr, CAUSAL: st.constexpr):
    t = st.thread_id(0)
    h = st.program_id(1)
    row = st.program_id(0) * BLOCK_M + t
    k_tile = st.shared((BLOCK_N, D), st.float32)
    v_tile = st.shared((BLOCK_N, D), st.float32)
    acc = st.shared((BLOCK_M, D), st.float32)
    for d in range(D):
        acc[t, d] = 0.0
    m = -float("inf")
    l = 0.0
    for start in range(0, seq, BLOCK_N):
        for e in range(t, BLOCK_N * D, BLOCK_M):
            j = start + e // D
            k_tile[e // D, e % D] = k[h, j, e % D] if j < seq else 0.0
            v_tile[e // D, e % D] = v[h, j, e % D] if j < seq else 0.0
        st.barrier()
        if row < seq:
            for jj in range(BLOCK_N):
                j = start + jj
                if j < seq and (not CAUSAL or j <= row):
                    s = 0.0
                    for d in range(D):
                        s += q[h, row, d] * k_tile[jj, d]
                    s *= scale
                    m_new = max(m, s)
                    correction = st.exp(m - m_new)
                    p = st.exp(s - m_new)
                    l = l * correction + p
                    for d in range(D):
                        acc[t, d] = acc[t, d] * correction + p * v_tile[jj, d]
                    m = m_new
        st.barrier()
    if row < seq:
        for d in range(D):
            out[h, row, d] = acc[t, d] / l


def run(device: str, heads: int = 3, seq: int = 37, dim: int = 16):
    q, k, v = (torch.randn(heads, seq, dim) for _ in range(3))
    out = torch.empty_like(q)
    bm, bn = 16, 8
    flash_attention[((seq + bm - 1) // bm, heads), bm](
        q, k, v, out, seq, 1.0 / math.sqrt(dim), D=dim, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=True,
        device=device)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                           is_causal=True)
    return out, ref


if __name__ == "__main__":       # python examples/kernels/flash_attention.py: check it here
    st.check_example(run, TOL)
