"""`python -m strata.gpu_check --out DIR`: the whole GPU acceptance run in one command, for the
few minutes a GPU is lent (see docs/gpu.md). `--dry-run` takes the same steps on a
CPU machine (the simulator stands in for the GPU) and marks what would need one.

    environment.py  what the machine has: GPU, driver, CUDA, torch, NVRTC, ncu, compute-sanitizer
    steps.py        the steps, each a command with its own timeout
    report.py       the markdown + JSON report and the packed logs, rewritten after every step
    cases.py        the sanitizer's small programs (also a GPU test), dsl_case.py its DSL kernel
    ncu_slowest.py  Nsight Compute on the op suite's slowest kernels relative to eager
"""
