"""@strata.kernel examples on the CPU against torch eager: `python -m strata.bench.dsl_bench`.

Why a table of ratios: hand-written SIMT kernels reach the CPU through threads-as-loops
(kernel_ir/thread_loops.py) and the C target; this says how far that is from PyTorch's own CPU
kernels on the same inputs. Each case runs strata and eager interleaved, ROUNDS times after a
warm-up, and reports medians; both use every core (torch.get_num_threads(), OpenMP's default).
"""
from __future__ import annotations

import importlib.util
import math
import pathlib
import statistics
import sys
import time

import torch

ROUNDS = 21
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "kernels"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"dsl_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases():
    """(name, strata call, eager call) on shapes where a kernel is worth timing."""
    va, sm, rms, ln, mm, fa = (_load(n) for n in ("vector_add", "softmax", "rmsnorm", "layernorm",
                                                  "matmul", "flash_attention"))
    n = 1 << 20
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    yield ("scale_add 1M", lambda: va.scale_add[(n + 255) // 256, 256](x, y, out, n, 2.0,
                                                                       BLOCK=256, device="cpu"),
           lambda: torch.add(y, x, alpha=2.0))
    r, c = 512, 1024
    a, o = torch.randn(r, c), torch.empty(r, c)
    yield ("softmax 512x1024", lambda: sm.softmax[r, 64](a, o, c, BLOCK=64, device="cpu"),
           lambda: torch.softmax(a, -1))
    w, b = torch.randn(c), torch.randn(c)
    yield ("rmsnorm 512x1024", lambda: rms.rmsnorm[r, 32](a, w, o, c, 1e-6, device="cpu"),
           lambda: torch.nn.functional.rms_norm(a, (c,), w, 1e-6))
    yield ("layernorm 512x1024", lambda: ln.layernorm[r // 4, (32, 4)](
        a, w, b, o, r, c, 1e-5, THREADS=32, ROWS=4, device="cpu"),
        lambda: torch.nn.functional.layer_norm(a, (c,), w, b, 1e-5))
    m = 256
    p, q, res = torch.randn(m, m), torch.randn(m, m), torch.empty(m, m)
    yield ("matmul 256^3 (tiled, fp32)", lambda: mm.matmul[(m // 16, m // 16), (16, 16)](
        p, q, res, m, m, m, TILE=16, device="cpu"), lambda: p @ q)
    h, s, d = 4, 256, 64
    qq, kk, vv = (torch.randn(h, s, d) for _ in range(3))
    oo = torch.empty_like(qq)
    yield ("flash attention 4x256x64 causal", lambda: fa.flash_attention[(s // 16, h), 16](
        qq, kk, vv, oo, s, 1 / math.sqrt(d), D=d, BLOCK_M=16, BLOCK_N=16, CAUSAL=True,
        device="cpu"),
        lambda: torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=True))


def measure(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> int:
    rows = []
    for name, ours, eager in cases():
        ours(), eager()                                   # compile, warm up
        t_ours, t_eager = [], []
        for _ in range(ROUNDS):
            t_ours.append(measure(ours))
            t_eager.append(measure(eager))
        a, b = statistics.median(t_ours), statistics.median(t_eager)
        rows.append((name, a, b))
        print(f"{name:34} strata {a:9.3f} ms   eager {b:9.3f} ms   eager/strata {b / a:5.2f}x",
              file=sys.stderr)
    print("| kernel | strata (ms) | eager (ms) | eager / strata |")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {b / a:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
