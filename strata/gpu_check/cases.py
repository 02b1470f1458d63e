"""The GPU acceptance cases: one small program per kind of kernel strata emits for CUDA (a row
reduction, softmax, fp32 and bf16 matmuls on mma.sync and on wgmma, an FP8 (e4m3) product on
wgmma and an FP8 GEMV, causal attention prefill on
tensor cores, split-KV decode attention, a q4_0 quantized GEMV, a `@strata.kernel` with shared
memory and barriers).

Each is compiled for its target, run once and checked against eager float64, and its source is
checked for the instruction it exists to exercise, so a case that silently took another path
fails. `python -m strata.gpu_check.cases` runs them in one process: on the GPU under
compute-sanitizer (gpu_check's sanitizer step), on the simulator (`--device sim`) anywhere.

    python -m strata.gpu_check.cases --device sim
    python -m strata.gpu_check.cases --device cuda rmsnorm_bf16 decode_split_kv
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

import strata

from ..bench import check
from ..core.context import Context
from ..quant.formats import QuantLinear
from ..quant.fp8 import FP8Linear
from .dsl_case import block_rmsnorm_check


@dataclass(frozen=True)
class GpuCase:
    what: str                              # one line: the kernel path it exercises
    make: Callable                         # () -> (module, cpu inputs)
    target: str | None = None              # pinned target; None: the GPU's own (sm_90a on H100)
    source_has: tuple[str, ...] = ()       # every string must be in the emitted CUDA
    kernels: int | None = None             # how many kernels the program must have
    knobs: dict = field(default_factory=dict)


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _rmsnorm():
    norm = torch.nn.RMSNorm(2048).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    return norm, (torch.randn(3, 2048).bfloat16(),)


def _softmax():
    return _Fn(lambda x: torch.softmax(x, -1)), (torch.randn(5, 1000),)


def _matmul(dtype, m=96, k=256, n=200):
    def make():
        return _Fn(torch.matmul), (torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype))
    return make


def _scaled_mm_fp8():
    e4m3 = torch.float8_e4m3fn

    def f(a, b, sa, sb):
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    return _Fn(f), ((torch.randn(128, 512) * 4).to(e4m3), (torch.randn(200, 512) * 4).to(e4m3),
                    torch.rand(128, 1) + 0.5, torch.rand(1, 200) + 0.5)


def _gemv_fp8():
    layer = FP8Linear.from_linear(torch.nn.Linear(2048, 512, bias=False)).eval()
    return layer, (torch.randn(1, 2048).bfloat16(),)


def _qkv(b, h, lq, lk, d, dtype=torch.bfloat16):
    return (torch.randn(b, h, lq, d).to(dtype), torch.randn(b, h, lk, d).to(dtype),
            torch.randn(b, h, lk, d).to(dtype))


def _prefill():
    return _Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), \
        _qkv(1, 2, 130, 130, 64)


def _decode():
    return _Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v)), _qkv(1, 4, 1, 300, 64)


def _gemv_q4_0():
    layer = QuantLinear.from_linear(torch.nn.Linear(2048, 512, bias=False), "q4_0").eval()
    return layer, (torch.randn(1, 1, 2048).bfloat16(),)


CASES: dict[str, GpuCase] = {
    "rmsnorm_bf16": GpuCase("row reduction, bf16 in and out", _rmsnorm),
    "softmax_f32": GpuCase("two-pass row softmax, a row that is not a multiple of the block",
                           _softmax),
    "matmul_f32": GpuCase("fp32 matmul, odd N (FMA tiles)", _matmul(torch.float32), "sm_90a"),
    "matmul_bf16_mma": GpuCase("bf16 matmul on mma.sync + ldmatrix (sm_80 code)",
                               _matmul(torch.bfloat16), "sm_80", ("mma.sync",)),
    "matmul_bf16_wgmma": GpuCase("bf16 matmul on wgmma + TMA (sm_90a)",
                                 _matmul(torch.bfloat16, 128, 512, 256), "sm_90a", ("wgmma",)),
    "scaled_mm_fp8_wgmma": GpuCase("torch._scaled_mm of e4m3 operands, row scales, on wgmma's "
                                   "k32 form + TMA (sm_90a)", _scaled_mm_fp8, "sm_90a",
                                   ("k32.f32.e4m3.e4m3",)),
    "attention_prefill": GpuCase("causal flash attention, 130 tokens, bf16 on tensor cores",
                                 _prefill, "sm_80", ("mma.sync",)),
    "attention_prefill_wgmma": GpuCase("the same attention on wgmma, A from registers, K and V "
                                       "in 128-byte swizzled rows (sm_90a)", _prefill, "sm_90a",
                                       ("wgmma.mma_async",), knobs={"INSTR": "wgmma"}),
    "decode_split_kv": GpuCase("one query against 300 keys: split-KV kernel + combine",
                               _decode, None, (), 2),
    "gemv_fp8": GpuCase("FP8Linear at M = 1: e4m3 weights by 16-byte loads, decoded by "
                        "cvt.rn.f16x2.e4m3x2 (sm_89+)", _gemv_fp8, None, ("cvt.rn.f16x2.e4m3x2",)),
    "gemv_q4_0": GpuCase("q4_0 weights (GGUF blocks): nibbles unpacked and scaled inside the "
                         "matrix-vector product", _gemv_q4_0, None, (">> 4",)),
}
DSL_CASE = "dsl_block_rmsnorm"
NAMES = (*CASES, DSL_CASE)


def build(name: str, device: str):
    """(program, module, cpu inputs) of a compiled case."""
    case = CASES[name]
    torch.manual_seed(0)
    module, inputs = case.make()
    ctx = Context(target=case.target, knobs=dict(case.knobs))
    return strata.compile(module, inputs, device=device, ctx=ctx), module, inputs


def run_case(name: str, device: str) -> str:
    """Compile, run and check one case on `device` ("cuda" or "sim"); '' when it passed, else
    one sentence saying what was wrong."""
    if name == DSL_CASE:
        return _run_dsl(device)
    case = CASES[name]
    prog, module, inputs = build(name, device)
    source = prog.source("cuda")
    missing = [s for s in case.source_has if s not in source]
    if missing:
        return f"the emitted CUDA has no {', '.join(missing)}: the case took another path"
    if case.kernels is not None and len(prog.kernels) != case.kernels:
        return f"{len(prog.kernels)} kernels, expected {case.kernels}"
    run_inputs = [x.cuda() for x in inputs] if device == "cuda" else [x.clone() for x in inputs]
    report = check.verify(prog, module, run_inputs)
    if device == "cuda":
        torch.cuda.synchronize()
    bad = [o for o in report.outputs if not o.passed]
    return "; ".join(o.problem or f"{o.name}: rel err {o.rel:.3g} (tol {o.tol})" for o in bad)


def _run_dsl(device: str) -> str:
    return block_rmsnorm_check(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.gpu_check.cases",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"cases to run (default all): {', '.join(NAMES)}")
    p.add_argument("--device", choices=("cuda", "sim"), default="cuda")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        print(f"unknown case {unknown[0]!r}; choose from {', '.join(NAMES)}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda needs a CUDA GPU visible to torch; use --device sim", file=sys.stderr)
        return 2
    failed = 0
    for name in args.names or NAMES:
        t0 = time.perf_counter()
        try:
            problem = run_case(name, args.device)
        except Exception as e:          # one case's crash is its verdict; the rest still run
            problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        failed += bool(problem)
        verdict = f"FAIL {problem}" if problem else "PASS"
        print(f"{name:22} {verdict}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
