"""`strata run -c ... --device cuda --bench [--profile]`: one snippet on this machine's GPU.

In order: the accuracy verdict (CUDA vs eager float64), the comparison table (eager,
torch.compile default and max-autotune-no-cudagraphs, strata: median time, speedups, achieved
GB/s or TFLOP/s and % of the ceilings measured in the same run), the per-kernel table, and with
--profile Nsight Compute's metrics per kernel. Returns the exit code: 0 when accuracy passes.
"""
from __future__ import annotations

import shutil

from ..core import dtypes
from .ncu import ncu_table, profile_snippet
from .report import comparison_table, kernel_table
from .results import STRATA, VARIANTS, CaseResult
from .runtime_adapter import compile_cuda, kernel_rows, kernel_times, with_times
from .variants import measure_variants


def _dtype_of(outputs) -> str:
    import torch

    flat, _ = torch.utils._pytree.tree_flatten(outputs)
    floats = [t for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return dtypes.from_torch(floats[0].dtype) if floats else "f32"


def _title(code: str, width: int = 72) -> str:
    code = " ".join(code.split())
    return code if len(code) <= width else code[:width - 1] + "…"


def bench_snippet(code: str, ctx=None, profile: bool = False, console=None) -> int:
    """Benchmark a `-c` snippet on the GPU; StrataError (e.g. no GPU: exit 2) propagates."""
    from rich.console import Console

    from ..frontend.snippet import parse_snippet
    from .harness import require_cuda
    require_cuda("--bench")
    console = console or Console(highlight=False)
    snippet = parse_snippet(code)
    module = snippet.module.to("cuda").eval()
    inputs = tuple(x.to("cuda") for x in snippet.example_inputs)
    return bench_module(module, inputs, _title(code), ctx, console, ncu_code=code if profile else None)


def bench_module(module, inputs, title: str, ctx, console, ncu_code: str | None = None,
                 timer=None, ceilings=None, compiler=None) -> int:
    """Verdict, comparison table, kernel table (and ncu for `ncu_code`) of one module. The
    defaults time on the GPU; tests pass a `timer`, `ceilings` and the simulator as `compiler`."""
    import torch

    from .accuracy import check_program, print_verdict
    from .harness import (
        L2Flush,
        input_copies,
        l2_bytes,
        measure_ceilings,
        rotating_arg_sets,
        tensor_bytes,
        time_cuda,
    )
    from .work import estimate_work

    with console.status("compiling with strata"):
        program = (compiler or compile_cuda)(module, inputs, ctx)
    with console.status("checking accuracy against eager (float64)"), torch.no_grad():
        outputs = module(*inputs)
        report = check_program(program, module, inputs)
    print_verdict(report, console)

    work = estimate_work(module, inputs, outputs)
    dtype = _dtype_of(outputs)
    if ceilings is None:
        with console.status("measuring the device ceilings (copy bandwidth, torch.mm)"):
            ceilings = measure_ceilings([dtype] if dtype in ("f32", "bf16", "f16") else [])
    flush = None
    if timer is None:
        flush, l2 = L2Flush(), l2_bytes()
        arg_sets = rotating_arg_sets(inputs, input_copies(tensor_bytes(inputs), l2))
        timer = lambda f, s: time_cuda(f, s, flush)
    else:
        arg_sets = [tuple(inputs)]
    with console.status("timing") as status:
        rows = measure_variants(module, arg_sets, timer, program, "ok", VARIANTS,
                                on_step=status.update)
    case = CaseResult(title, dtype, work.bytes, work.flops, rows,
                      accuracy="PASS" if report.passed else "FAIL")
    console.print(comparison_table(case, ceilings))

    kernels = kernel_rows(program)
    if case.variant(STRATA).ok:
        with console.status("timing each kernel"):
            try:
                kernels = with_times(kernels, kernel_times(program, inputs, flush))
            except Exception as e:  # noqa: BLE001 - the table shows "—" for time
                console.print(f"per-kernel times unavailable: {type(e).__name__}: {e}")
    console.print(kernel_table(kernels))

    if ncu_code is not None:
        _print_ncu(ncu_code, [k.name for k in kernels], console)
    return 0 if report.passed else 1


def _print_ncu(code: str, names: list[str], console) -> None:
    if shutil.which("ncu") is None:
        console.print("--profile: ncu (Nsight Compute) is not installed, so there are no per-kernel "
                      "hardware metrics")
        return
    with console.status("profiling each kernel with ncu"):
        kernels, error = profile_snippet(code, names)
    console.print(f"--profile: {error}" if error else ncu_table(kernels))
