"""What int8 dot products would give a prefill's quantized linears on this CPU: the kernel of
strata/codegen/int8_rows.c (activation rows as vpdpbusd's lanes, weights read as stored) against
what strata runs today (the weight dequantized to bf16 by a kernel of its own, then a bf16 GEMM)
and torch eager on the same QuantLinear.

Why: issue 56 asks for prefill >= 1.5x llama.cpp's, whose prefill multiplies int8 by int8; strata's
bf16 GEMMs already run near the vdpbf16ps peak (Zen 5: 784 of 931 GFLOP/s), and vpdpbusd does 2
to 3 times the work per cycle. This records what the kernel reaches before the compiler chooses
it (a Kernel IR form, next step). It also holds the kernel's loader (`load_kernel`, `int8_rows`),
shared with tests/codegen/test_int8_rows.py.

Run `python -m strata.bench.int8_probe [--m 128 --k 2048 --n 5632]`: a markdown table, medians
of interleaved rounds, and each path's error against float64; exits 2 on a CPU without
AVX512-VNNI (the kernel has no AVX2 path yet).
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

from ..runtime import native_build
from ..runtime.cc import cpu_features

KERNEL = Path(__file__).resolve().parent.parent / "codegen" / "int8_rows.c"
FORMATS = {"q4_0": 0, "q4_k": 1}
NEEDS = ("avx512_vnni", "avx512bw", "avx512vl")


def available() -> bool:
    return set(NEEDS) <= set(cpu_features().split())


def load_kernel() -> ctypes.CDLL:
    lib = native_build.load_library(native_build.build_library(KERNEL.read_text()))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.st_int8_rows.argtypes = [i, p, i, i, i, p, p, p, p, p, p]
    lib.st_int8_rows.restype = i
    return lib


def int8_rows(lib, x: torch.Tensor, layer) -> torch.Tensor:
    """x [M, K] (f32, contiguous) by a q4_0 or q4_k QuantLinear's weight: [M, N] f32."""
    fmt = FORMATS[layer.fmt]
    m, k = x.shape
    n = layer.qs.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    parts = [layer.qs, layer.d] + ([layer.sc, layer.dmin, layer.mn] if fmt else [None] * 3)
    ptrs = [t.contiguous().data_ptr() if t is not None else None for t in parts]
    if lib.st_int8_rows(fmt, x.contiguous().data_ptr(), m, n, k, *ptrs, out.data_ptr()) != 0:
        raise ValueError(f"int8 rows take N a multiple of 8 and K of 32 (q4_k: 256), not "
                         f"N={n}, K={k}")
    return out


def _layer(fmt: str, k: int, n: int):
    from ..quant.formats import quantize
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False))
    quantize(module, fmt)
    return module[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.bench.int8_probe",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=128, help="activation rows (default 128)")
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=5632)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    if not available():
        lacks = [f for f in NEEDS if f not in cpu_features().split()]
        print(f"int8_probe: this CPU lacks {', '.join(lacks)}", file=sys.stderr)
        return 2
    import strata
    from ..bench.env import cpu_name
    lib = load_kernel()
    flops = 2 * args.m * args.k * args.n
    print(f"{cpu_name()}, torch threads {torch.get_num_threads()}, M={args.m} K={args.k} "
          f"N={args.n}; ms (GOPS), median of {args.rounds} interleaved rounds; error: max |out - "
          f"float64| / max |float64|\n")
    print("| format | int8 rows | strata today (dequantize + bf16 GEMM) | eager (bf16) | "
          "int8 / strata | error int8 | error strata |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for fmt in FORMATS:
        layer = _layer(fmt, args.k, args.n)
        module = torch.nn.Sequential(layer)         # scales stay f16, as GGUF stores them
        x = torch.randn(args.m, args.k).to(torch.bfloat16)
        xf = x.float()
        compiled = strata.compile(module, (x,), device="cpu")
        ref = xf.double() @ layer.weight(torch.float64).t()
        runs = {"int8": lambda: int8_rows(lib, xf, layer), "strata": lambda: compiled(x),
                "eager": lambda: module(x)}
        errs = {name: float((run().double() - ref).abs().max() / ref.abs().max())
                for name, run in runs.items() if name != "eager"}
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
        ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
        cell = lambda name: f"{ms[name]:.3f} ({flops / ms[name] / 1e6:.0f})"     # noqa: E731
        print(f"| {fmt} | {cell('int8')} | {cell('strata')} | {cell('eager')} | "
              f"{ms['strata'] / ms['int8']:.2f}x | {errs['int8']:.2g} | {errs['strata']:.2g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
