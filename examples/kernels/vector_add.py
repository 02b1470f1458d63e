"""out = alpha * x + y: one element per thread, a runtime length and scale."""
import torch

import strata as st

TOL = 1e-5


@st.kernel
def scale_add(x, y, out, n: int, alpha: float, BLOCK: st.constexpr):
    i = st.program_id(0) * BLOCK + st.thread_id(0)
    if i < n:
        out[i] = alpha * x[i] + y[i]


def run(device: str, n: int = 1001):
    x, y = torch.randn(n), torch.randn(n)
    out = torch.empty(n)
    scale_add[(n + 127) // 128, 128](x, y, out, n, 2.5, BLOCK=128, device=device)
    return out, 2.5 * x.double() + y.double()


if __name__ == "__main__":       # python examples/kernels/vector_add.py: check it here
    st.check_example(run, TOL)
