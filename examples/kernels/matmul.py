"""C = A @ B with shared-memory tiles: a 2-D block of TILE x TILE threads, one output each; every
step of the K loop stages one tile of A and one of B (zero-padded at the edges), then barriers."""
import torch

import strata as st

TOL = 1e-4


@st.kernel
def matmul(a, b, c, M: int, N: int, K: int, TILE: st.constexpr):
    tx = st.thread_id(0)
    ty = st.thread_id(1)
    row = st.program_id(1) * TILE + ty
    col = st.program_id(0) * TILE + tx
    a_tile = st.shared((TILE, TILE), st.float32)
    b_tile = st.shared((TILE, TILE), st.float32)
    acc = 0.0
    for k0 in range(0, K, TILE):
        a_tile[ty, tx] = a[row, k0 + tx] if row < M and k0 + tx < K else 0.0
        b_tile[ty, tx] = b[k0 + ty, col] if k0 + ty < K and col < N else 0.0
        st.barrier()
        for k in range(TILE):
            acc += a_tile[ty, k] * b_tile[k, tx]
        st.barrier()
    if row < M and col < N:
        c[row, col] = acc


def run(device: str, m: int = 37, n: int = 29, k: int = 53):
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = torch.empty(m, n)
    tile = 16
    matmul[((n + tile - 1) // tile, (m + tile - 1) // tile), (tile, tile)](
        a, b, c, m, n, k, TILE=tile, device=device)
    return c, a.double() @ b.double()


if __name__ == "__main__":       # python examples/kernels/matmul.py: check it here
    st.check_example(run, TOL)
