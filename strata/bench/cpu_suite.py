"""`python -m strata.bench.suite --device cpu`: one case of the LLM op suite natively on this
machine's CPU, against eager and torch.compile (Inductor's C++ backend) on the same inputs.

Why a runner of its own: a CPU has no events or L2 flush to time with, and these machines are
shared and noisy, so every variant is timed in interleaved rounds (cpu_bench.py) instead of one
after another, and the ratios compare numbers taken in the same seconds. The accuracy verdict
against eager float64 comes first, as on the GPU; a case that fails is timed but not counted.
"""
from __future__ import annotations

from .results import STRATA, CaseResult, Timing, VariantRow
from .runtime_adapter import kernel_rows
from .variants import prepare, reason, strata_status

SEQS = (1, 128)                 # the CPU suite's default token counts (2048 is minutes per case)
MODELS = ("tinyllama",)
ROUNDS = 11


def compile_cpu(module, inputs):
    from ..api import compile as strata_compile
    return strata_compile(module, inputs, device="cpu")


def run_cpu_case(case, which, step, rounds: int = ROUNDS, compiler=None) -> CaseResult:
    """Build, compile, check and time one case on the CPU. (Tests pass a `compiler`.)"""
    import torch

    from .accuracy import check_program, verdict_line
    from .cpu_bench import interleaved_samples
    from .work import estimate_work
    step("building")
    module, inputs = case.build("cpu")
    work = estimate_work(module, inputs, flops=case.flops())
    result = CaseResult(case.name, case.dtype, work.bytes, work.flops, [], op=case.op,
                        model=case.model.name, seq=case.seq)
    program, status = None, "ok"
    if STRATA in which:
        step("compiling with strata")
        try:
            program = (compiler or compile_cpu)(module, inputs)
            step("checking accuracy")
            result.accuracy = verdict_line(check_program(program, module, inputs))
        except Exception as e:  # noqa: BLE001 - "unsupported: ..." / "failed: ..." row, suite goes on
            program, status = None, strata_status(e)
    calls, rows = {}, {}
    for name in which:
        if name == STRATA and program is None:
            rows[name] = VariantRow(STRATA, status)
            continue
        step(f"preparing {name}")
        try:
            calls[name] = prepare(name, module, inputs, program)
        except Exception as e:  # noqa: BLE001 - a failing variant is a row, the run goes on
            rows[name] = VariantRow(name, f"failed: {reason(e)}")
    if calls:
        step(f"timing {', '.join(calls)} in {rounds} interleaved rounds")
        for name, samples in interleaved_samples(calls, inputs, rounds).items():
            rows[name] = VariantRow(name, "ok", Timing.from_samples(samples))
    result.variants = [rows[name] for name in which]
    if program is not None:
        result.kernels = kernel_rows(program)
    del module, inputs, program
    torch._dynamo.reset()
    return result
