"""The native runtime's team size (runtime/threads.py): the user's number when given (set_threads,
STRATA_THREADS / OMP_NUM_THREADS), else the cores other processes leave free; the programs'
results do not depend on it."""
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from strata.runtime import cc, threads
from strata.core.errors import DeviceUnavailable
from strata.runtime.native import NativeProgram
from strata.kernel_ir.sim import simulate

try:
    cc.find_compiler()
except DeviceUnavailable:
    pytest.skip("no C compiler is installed, so native programs cannot be run here; install gcc",
                allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import cpu_builders as C  # noqa: E402


class FakeLoad:
    """OtherLoad with a given share of the machine taken by others."""
    share_value = 0.0

    def __init__(self, pids=()):
        pass

    def share(self):
        return FakeLoad.share_value


@pytest.fixture
def governor(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("STRATA_THREADS", raising=False)
    monkeypatch.setattr(threads, "OtherLoad", FakeLoad)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads, "_cores", lambda: 4)
    return threads.Threads()


@pytest.mark.parametrize("others, want", [(0.0, 4), (0.05, 4), (0.2, 3), (0.25, 3), (0.5, 2),
                                          (0.8, 1), (1.0, 1)])
def test_the_team_is_the_cores_others_leave(governor, others, want):
    """others: the share of the 4-CPU machine other processes took; a core they used at least
    40% of the time is theirs."""
    FakeLoad.share_value = others
    governor.start()
    time.sleep(threads.FIRST_LOOK)
    assert governor.current() == want


def test_the_users_number_wins(governor, monkeypatch):
    FakeLoad.share_value = 1.0
    governor.set(3)
    assert governor.current() == 3
    governor.set(None)
    monkeypatch.setenv("STRATA_THREADS", "2")
    governor.start()
    time.sleep(threads.FIRST_LOOK)
    assert governor.current() == 2
    with pytest.raises(ValueError, match="at least 1"):
        governor.set(0)


def test_unknown_load_keeps_every_core(governor, monkeypatch):
    monkeypatch.setattr(FakeLoad, "share", lambda self: None)
    governor.start()
    time.sleep(threads.FIRST_LOOK)
    assert governor.current() == 4


@pytest.mark.skipif(len(threads.os.sched_getaffinity(0)) < 2, reason="one core: no team to shrink")
def test_busy_processes_shrink_the_team(monkeypatch):
    """As many busy processes as cores: the next look leaves one thread (real /proc/stat). Not
    the number an earlier test's `--threads 2` left in OMP_NUM_THREADS (bench/threads_option.py
    writes it for the process)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("STRATA_THREADS", raising=False)
    cores = len(threads.os.sched_getaffinity(0))
    busy = [subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 20\n"
                              "while time.time() < t: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.5)                  # the interpreters started and are spinning
        g = threads.Threads()
        g.start()
        time.sleep(0.5)
        g._due = 0
        assert g.current() == 1
    finally:
        for p in busy:
            p.kill()
            p.wait()


def test_results_do_not_depend_on_the_team():
    program = C.two_kernels_in_place(100_003, chunk=64)
    prog = NativeProgram(program)
    rng = np.random.default_rng(0)
    data = {b.name: rng.standard_normal(b.shape).astype(np.float32)
            for b in program.buffers if b.kind == "input"}
    want = simulate(program, {k: v.copy() for k, v in data.items()})
    try:
        for n in (1, 2, 3):
            threads.set_threads(n)
            cache = torch.from_numpy(data["cache"].copy())
            out, _ = prog.run([torch.from_numpy(data["x"]), torch.from_numpy(data["y"]), cache])
            assert prog.threads == n
            np.testing.assert_array_equal(out.numpy(), want["out"])
            np.testing.assert_array_equal(cache.numpy(), want["cache"])
    finally:
        threads.set_threads(None)


def test_torch_keeps_its_own_thread_count():
    """torch's CPU wheel links the same libgomp as strata's libraries: the team is a num_threads
    clause of strata's kernels, so torch.get_num_threads() never moves (dynamo guards on it)."""
    before = torch.get_num_threads()
    prog = NativeProgram(C.two_kernels_in_place(100_003, chunk=64))
    try:
        threads.set_threads(1 if before > 1 else 2)
        prog.run([torch.zeros(100_003), torch.zeros(100_003), torch.zeros(100_003)])
        assert prog.threads != before and torch.get_num_threads() == before
    finally:
        threads.set_threads(None)
