"""`st.check_example(run, tol)`: what an examples/kernels/*.py file does when run as a script:
its `run(device)` on the simulator and natively on the CPU (where a C compiler is found),
each checked against the float64 reference it returns, one line per device."""
from __future__ import annotations

import sys

from ..core.errors import StrataError


def check_example(run, tol: float, devices=("sim", "cpu")) -> int:
    import torch

    failed = 0
    for device in devices:
        torch.manual_seed(0)
        try:
            got, want = run(device)
        except StrataError as e:            # no C compiler, say: one sentence, the rest go on
            print(f"{device}: skipped: {e}")
            continue
        err = float((got.double() - want.double()).abs().max()) if got.numel() else 0.0
        ok = got.shape == want.shape and err <= tol + tol * float(want.double().abs().max())
        failed += not ok
        print(f"{device}: {'PASS' if ok else 'FAIL'} max abs err {err:.3g} (tolerance {tol:g})")
    if failed:
        sys.exit(1)
    return 0
