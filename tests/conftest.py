"""Shared test helpers: compile through every stage, run on the simulator, compare with eager."""
import os
import tempfile

import numpy as np
import pytest
import torch

import strata
from strata import check
from strata.context import Context

# Persistent caches (captured snippets, kernels) go to a scratch directory, never the user's.
os.environ["STRATA_CACHE_DIR"] = tempfile.mkdtemp(prefix="strata-test-cache-")


def run_and_compare(fn, inputs, contraction=False, ctx=None):
    """Compile fn through the whole pipeline, run the kernels in the simulator and assert every
    output (and input updated in place) matches eager float64 within the DESIGN.md tolerance,
    with eager's shape and dtype. Returns the Program."""
    prog = strata.compile(fn, inputs, ctx=ctx or Context())
    prog.lowered.kernel.verify()
    compile_with_nvrtc(prog)
    report = check.verify(prog, fn, inputs, contraction)     # what the caller gets, as eager
    for res in report.outputs:
        assert res.passed, res.problem or (f"{res.name}: rel err {res.rel:.3g}, max abs "
                                           f"{res.max_abs:.3g} (tol {res.tol})")
    return prog


ARCHS = ("sm_80", "sm_90")


def compile_with_nvrtc(prog):
    """Every generated kernel must compile with NVRTC for sm_80 and sm_90."""
    from strata.runtime.nvrtc import compile_cuda
    for arch in ARCHS:
        compile_cuda(prog.source("cuda"), arch, want="ptx")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)
