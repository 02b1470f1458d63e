"""GELU (erf form) on bfloat16 data: loads widen to float32, the store rounds to bfloat16."""
import torch

import strata as st

TOL = 1e-2


@st.kernel
def gelu(x, out, n: int, BLOCK: st.constexpr):
    i = st.program_id(0) * BLOCK + st.thread_id(0)
    if i < n:
        v = x[i]
        out[i] = 0.5 * v * (1.0 + st.erf(v * 0.7071067811865476))


def run(device: str, n: int = 777):
    x = torch.randn(n).to(torch.bfloat16)
    out = torch.empty_like(x)
    gelu[(n + 255) // 256, 256](x, out, n, BLOCK=256, device=device)
    return out, torch.nn.functional.gelu(x.double())


if __name__ == "__main__":       # python examples/kernels/gelu.py: check it here
    st.check_example(run, TOL)
