"""Shared test helpers: compile through every stage, run on the simulator, compare with eager."""
import contextlib
import os
import re
import shutil
import tempfile
import types

import numpy as np
import pytest
import torch

import strata
from strata.bench import check
from strata.core.context import Context
from strata.kernel_ir.verify import verify_program


def _run_cache_dir() -> str:
    """Persistent caches (captured snippets, native libraries, compiled models) go to a scratch
    directory, never the user's: one for the whole run, shared by the xdist workers (each gets the
    same PYTEST_XDIST_TESTRUNUID), so a program one test built is a cache hit for every later test
    on either worker (entries are written atomically: racing workers are safe). A test of the
    caches themselves takes a fresh one (the cache_dir fixture)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run or not re.fullmatch(r"\w+", run):
        _MADE.append(tempfile.mkdtemp(prefix="strata-test-cache-"))
        return _MADE[-1]
    path = _xdist_cache_dir(run)
    os.makedirs(path, exist_ok=True)
    return path


def _xdist_cache_dir(run: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"strata-test-cache-{run}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """The run's caches go when it ends (a precompiled C prelude is 25 MB): xdist's controller
    removes the workers' shared directory; a process without xdist, the one it made."""
    if hasattr(session.config, "workerinput"):
        return
    dsession = session.config.pluginmanager.getplugin("dsession")
    run = getattr(getattr(dsession, "nodemanager", None), "testrunuid", None)
    for path in [*_MADE, *([_xdist_cache_dir(run)] if run and re.fullmatch(r"\w+", run) else [])]:
        shutil.rmtree(path, ignore_errors=True)


_MADE: list[str] = []         # made by this process (without xdist): removed when its run ends
os.environ["STRATA_CACHE_DIR"] = _run_cache_dir()


def run_and_compare(fn, inputs, contraction=False, ctx=None, native=True):
    """Compile fn through the whole pipeline, run the kernels in the simulator and assert every
    output (and input updated in place) matches eager float64 within the docs/design.md tolerance,
    with eager's shape and dtype; then again natively on the CPU target (native=False skips
    that; so does a machine without a C compiler). Returns the simulator's Program."""
    with _capture_once() as captured:
        prog = strata.compile(fn, inputs, ctx=ctx or Context())
        verify_program(prog.lowered.kernel)
        compile_with_nvrtc(prog)
        _assert_matches(check.verify(prog, fn, inputs, contraction))   # what the caller gets
        if HAS_CC and native:                  # the same program natively on the CPU
            captured.reuse = True
            cpu = strata.compile(fn, inputs, device="cpu")
            _assert_matches(check.verify(cpu, fn, inputs, contraction), "cpu: ")
    return prog


@contextlib.contextmanager
def _capture_once():
    """strata.compile's torch.export done once for run_and_compare's two compiles of one fn and
    inputs: the CPU compile (after `reuse` is set) lowers the Torch IR the simulator's compile
    captured; lowering does not change it (each stage builds a new program). The capture's own
    tests (tests/frontend) call it directly."""
    from strata import api
    real, seen, state = api.capture, [], types.SimpleNamespace(reuse=False)

    def capture(fn, tensors, input_names=None):
        key = ([(t.shape, t.dtype, t.stride()) for t in tensors], input_names)
        if state.reuse and seen and seen[0][0] == key:
            return seen[0][1]
        seen[:] = [(key, real(fn, tensors, input_names=input_names))]
        return seen[0][1]

    api.capture = capture
    try:
        yield state
    finally:
        api.capture = real


def _assert_matches(report, where: str = "") -> None:
    for res in report.outputs:
        assert res.passed, where + (res.problem or f"{res.name}: rel err {res.rel:.3g}, max abs "
                                                   f"{res.max_abs:.3g} (tol {res.tol})")


def _find_cc() -> bool:
    from strata.core.errors import StrataError
    from strata.runtime.cc import find_compiler
    try:
        find_compiler()
        return True
    except StrataError:
        return False


HAS_CC = _find_cc()


ARCHS = ("sm_80", "sm_90")


def skip_unless_sass_readable() -> None:
    """Skip the calling test module, in one sentence, where NVRTC, the CUDA headers or NVIDIA's
    cuobjdump and nvdisasm are missing: the SASS tests read the machine code through them."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from strata.core.errors import DeviceUnavailable
    from strata.runtime.nvrtc import include_dirs
    from strata.runtime.sass import tool
    try:
        tool("cuobjdump"), tool("nvdisasm")
    except DeviceUnavailable as e:
        pytest.skip(str(e), allow_module_level=True)
    if not include_dirs():
        pytest.skip("no CUDA headers (cuda_fp16.h) found", allow_module_level=True)


def compile_with_nvrtc(prog):
    """Every generated kernel must compile with NVRTC for sm_80 and sm_90."""
    from strata.runtime.nvrtc import compile_cuda
    for arch in ARCHS:
        for unit in prog.lowered.units.sources:      # the translation units NVRTC takes
            compile_cuda(unit, arch, want="ptx")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """strata's caches (capture, native, tuning database) in a fresh directory, caching on."""
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("STRATA_NO_CACHE", raising=False)
    return tmp_path


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


# A test that skips without a GPU is a GPU test: `pytest -m gpu` (python -m strata.gpu_check) runs
# exactly those, whichever file they are in.
_NEEDS_GPU = re.compile(r"needs a CUDA GPU|no CUDA GPU|no sm_\d+\+ GPU")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(_NEEDS_GPU.search(str(m.kwargs.get("reason", "")))
               for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.gpu)
