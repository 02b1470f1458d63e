"""Benchmarks: time strata's kernels against PyTorch eager and torch.compile on a GPU, with the
accuracy verdict first and every speed paired with the measured device ceiling.

    results.py          the measured numbers (pure records, JSON round-trip)
    report.py           rich tables, markdown and JSON reports from those numbers (pure)
    harness.py          CUDA-event timing with an L2 flush; the copy and matmul ceilings
    work.py             bytes moved and FLOPs of a program
    variants.py         eager / torch.compile / strata callables; failures become rows
    runtime_adapter.py  the one place that reads per-kernel rows and times from the runtime
    accuracy.py         the verdict on CUDA outputs (strata/bench/check.py tolerances)
    env.py              device, date and versions recorded with every report
    cases.py            the LLM op suite at TinyLlama and Qwen2.5-7B shapes
    suite.py            `python -m strata.bench.suite`
    cli_bench.py        `strata run -c ... --device cuda --bench [--profile]`
    contractions.py     `python -m strata.bench.contractions`: matmul / attention vs cuBLAS and
                        the fastest SDPA (cases: contraction_cases.py, table: contraction_report.py)
    decode.py           `python -m strata.bench.decode`: decode tokens/s vs HF eager and
                        torch.compile (loops: decode_loops.py, numbers and table: decode_report.py)
    ncu.py              Nsight Compute per-kernel metrics (run and CSV parse)
    busy.py             `python -m strata.bench.busy`: CPU decode beside busy processes, the
                        default team against fixed thread counts (runtime/threads.py)
    threads_option.py   `--threads N` of the commands and benchmarks (strata's and torch's)
    generate_compile.py `python -m strata.bench.generate_compile`: transformers' generate through
                        torch.compile, eager / Inductor / strata, static and dynamic cache
    backend_overhead.py `python -m strata.bench.backend_overhead`: torch.compile's strata backend
                        against strata.compile on the suite's projections, MLP, decoder block
    train.py            `python -m strata.bench.train`: one AdamW step, eager / Inductor / strata

Everything GPU-only is imported lazily: `import strata.bench.*` works on a CPU machine.
"""
