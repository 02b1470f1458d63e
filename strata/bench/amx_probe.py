"""What AMX does on this CPU: the bf16 micro-kernel of strata/codegen/amx_kernel.c against torch's
bf16 matmul (oneDNN, which uses AMX where the CPU has it) and the tiles' own peak.

Why: issue 26 item 3 puts bf16 contractions on AMX tiles; AMX machines are rare for this
project, so this records what one measures. It also holds the kernel's loader (`load_kernel`,
`gemm`, `pack_vnni`), shared with tests/codegen/test_amx_kernel.py: the kernel is built with
strata's own compiler path (runtime/cc.py's find_compiler and flags, runtime/native_build.py's
cache), as an emulation (`#define STRATA_AMX_EMULATE`) or with the AMX instructions.

Run `python -m strata.bench.amx_probe`: prints markdown tables (GFLOP/s: the median of several
runs, the best in brackets; /proc/loadavg is read before each timing); exits 2 on a CPU without
AMX. The kernel's B is packed once, outside the timing; torch.matmul gets plain row-major B.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ..runtime import native_build
from ..runtime.cc import cpu_features

KERNEL = Path(__file__).resolve().parent.parent / "codegen" / "amx_kernel.c"
SHAPES = ((512, 5632, 2048), (128, 5632, 2048), (16, 5632, 2048))
TILE_FLOP = 16 * 16 * 32 * 2                 # one tdpbf16ps: a 16x16 fp32 tile += 16x32 @ 32x16


def has_amx() -> bool:
    flags = set(cpu_features().split())
    return {"amx_tile", "amx_bf16"} <= flags


def load_kernel(emulate: bool) -> ctypes.CDLL:
    """The kernel as a loaded library (built, or taken from strata's native cache)."""
    source = ("#define STRATA_AMX_EMULATE 1\n" if emulate else "") + KERNEL.read_text()
    lib = native_build.load_library(native_build.build_library(source))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.strata_amx_gemm_bf16.argtypes = [i, i, i, p, i, p, p, i, i, p]
    lib.strata_amx_config_roundtrip.argtypes = [p, p]
    lib.strata_amx_peak.argtypes = [ctypes.c_long, i, p]
    lib.strata_amx_peak.restype = ctypes.c_float
    return lib


def pack_vnni(b: torch.Tensor) -> torch.Tensor:
    """B[K, N] (bf16) in the VNNI pair layout: packed[k/2][n][2] = B[k][n], B[k+1][n]."""
    k, n = b.shape
    return b.reshape(k // 2, 2, n).transpose(1, 2).contiguous()


def gemm(lib, a: torch.Tensor, bp: torch.Tensor, threads: int = 1, k: int | None = None,
         out: torch.Tensor | None = None, cfg_out: ctypes.Array | None = None) -> torch.Tensor:
    """C = A[:, :k] @ B with the kernel; `a` may have a row stride above k (lda), `out` one above
    N (ldc). RuntimeError when the kernel refuses (shape, or no AMX permission)."""
    m, n = a.shape[0], bp.shape[1]
    k = k or a.shape[1]
    out = torch.empty(m, n, dtype=torch.float32) if out is None else out
    assert a.dtype == bp.dtype == torch.bfloat16 and a.stride(1) == 1 and out.stride(1) == 1
    rc = lib.strata_amx_gemm_bf16(m, n, k, a.data_ptr(), a.stride(0), bp.data_ptr(),
                                  out.data_ptr(), out.stride(0), threads, cfg_out)
    if rc != 0:
        raise RuntimeError(f"strata_amx_gemm_bf16 returned {rc} for {m}x{n}x{k}")
    return out


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _times(fn, runs: int) -> tuple[float, float]:
    """(median, best) seconds of `runs` calls after a warm-up call."""
    fn()                                                     # warm: pages, caches, tile state
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def _rate(work: float, times: tuple[float, float], unit: float) -> str:
    return f"{work / times[0] / unit:.0f} ({work / times[1] / unit:.0f})"


def _torch_isa() -> str:
    """The oneDNN implementation torch's bf16 matmul ran (ONEDNN_VERBOSE of a child process)."""
    code = ("import torch; torch.matmul(torch.ones(128, 256, dtype=torch.bfloat16), "
            "torch.ones(256, 256, dtype=torch.bfloat16))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ONEDNN_VERBOSE": "1"}, timeout=120, check=False)
    for line in run.stdout.splitlines():
        if ",exec," in line and ",matmul," in line:
            return line.split(",")[6]
    return "unknown (no oneDNN matmul line)"


def measure_gemm(lib, threads: int, runs: int = 7) -> list[str]:
    rows = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k).to(torch.bfloat16)
        b = torch.randn(k, n).to(torch.bfloat16)
        bp, out = pack_vnni(b), torch.empty(m, n)
        ref = a.float() @ b.float()
        err = (gemm(lib, a, bp, threads, out=out) - ref).abs().max().item() / ref.abs().max().item()
        assert err < 1e-5, f"kernel wrong at {m}x{n}x{k}: rel err {err:.3g}"
        flop = 2.0 * m * n * k
        load1 = _loadavg()
        t_amx = _times(lambda: gemm(lib, a, bp, threads, out=out), runs)
        torch.set_num_threads(threads)
        load2 = _loadavg()
        t_torch = _times(lambda: torch.matmul(a, b), runs)
        rows.append(f"| {m}x{n}x{k} | {threads} | {_rate(flop, t_amx, 1e9)} | "
                    f"{_rate(flop, t_torch, 1e9)} | {t_torch[0] / t_amx[0]:.2f} | "
                    f"{load1} / {load2} |")
    return rows


def measure_peak(lib, threads: int, nacc: int, iters: int = 2_000_000, runs: int = 5) -> str:
    src = torch.full((16, 32), 1 / 64, dtype=torch.bfloat16)

    def run():
        with ThreadPoolExecutor(threads) as pool:          # ctypes drops the GIL: one core each
            list(pool.map(lambda _: lib.strata_amx_peak(iters, nacc, src.data_ptr()),
                          range(threads)))
    load = _loadavg()
    t = _times(run, runs)
    flop = threads * iters * nacc * TILE_FLOP
    return f"| {nacc} | {threads} | {flop / t[0] / 1e12:.2f} ({flop / t[1] / 1e12:.2f}) | {load} |"


def main() -> int:
    if not has_amx():
        print("This CPU has no AMX (/proc/cpuinfo lists no amx_tile and amx_bf16), so there is "
              "nothing to measure.")
        return 2
    lib = load_kernel(emulate=False)
    if lib.strata_amx_request_permission() != 0:
        print("The kernel refused AMX tile data (arch_prctl(ARCH_REQ_XCOMP_PERM) failed; Linux "
              "older than 5.16?), so there is nothing to measure.")
        return 2
    threads = (1, 2) if (os.cpu_count() or 1) >= 2 else (1,)
    print(f"torch {torch.__version__}, bf16 matmul by oneDNN `{_torch_isa()}`\n")
    print("GFLOP/s and TFLOP/s: median of the runs (best run in brackets)\n")
    print("| bf16 GEMM MxNxK | threads | AMX kernel GFLOP/s | torch.matmul GFLOP/s | "
          "kernel / torch (medians) | loadavg (kernel / torch) |")
    print("|---|---|---|---|---|---|")
    for t in threads:
        print("\n".join(measure_gemm(lib, t)))
    print("\n| tdpbf16ps peak, accumulator tiles | threads | TFLOP/s | loadavg |")
    print("|---|---|---|---|")
    for t in threads:
        for nacc in (4, 6):
            print(measure_peak(lib, t, nacc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
