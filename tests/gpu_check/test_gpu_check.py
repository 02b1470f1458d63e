"""`python -m strata.gpu_check`: the dry run CI keeps working (every step taken, the simulator
standing in for the GPU, at most 8 files written), bad input is one sentence, and the pieces that
read other tools' output (pytest's junit XML, the op suite's JSON) read them right."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from strata.gpu_check import steps
from strata.gpu_check.__main__ import STEPS, main
from strata.gpu_check.ncu_slowest import slowest

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_takes_every_step(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "strata.gpu_check", "--dry-run", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu_check.json", "gpu_check.md", "gpu_check_logs.tar.gz"]
    report = json.loads((out / "gpu_check.json").read_text())
    names = [s["name"] for s in report["steps"]]
    assert names[0] == "install" and names[-1] == "ncu on the slowest kernels" and len(names) == 12
    assert {s["status"] for s in report["steps"]} == {"dry-run"}, report["steps"]
    tests = next(s for s in report["steps"] if s["name"] == "GPU tests")
    assert int(tests["summary"].split()[0]) >= 50          # the GPU tests were collected
    sanitizer = next(s for s in report["steps"] if s["name"] == "compute-sanitizer")
    from strata.gpu_check.cases import NAMES
    assert f"{len(NAMES)}/{len(NAMES)} cases pass" in sanitizer["summary"]   # on the simulator
    assert "## decode: dry-run" in (out / "gpu_check.md").read_text()
    assert "## decode q4_0: dry-run" in (out / "gpu_check.md").read_text()
    assert "## training: dry-run" in (out / "gpu_check.md").read_text()
    assert "## gemv sweep: dry-run" in (out / "gpu_check.md").read_text()
    assert "## attention sweep: dry-run" in (out / "gpu_check.md").read_text()


def test_the_whole_contraction_table_is_a_step_of_its_own(tmp_path):
    """Not in the default run (it takes a second call); --steps contractions-full lists its
    cases in a dry run."""
    from strata.gpu_check.__main__ import DEFAULT_STEPS
    assert "contractions-full" in STEPS and "contractions-full" not in DEFAULT_STEPS
    out = tmp_path / "out"
    assert main(["--dry-run", "--steps", "contractions-full", "--out", str(out)]) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    (step,) = report["steps"]
    assert step["name"] == "contractions full" and step["status"] == "dry-run"


@pytest.mark.parametrize("argv, says", [(["--steps", "tests,bogus"], "choose from"),
                                        (["--limit-s", "0"], "must be positive")])
def test_bad_input_is_one_sentence(argv, says, capsys):
    assert main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_asks_for_dry_run(capsys):
    assert main(["--steps", "install"]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_junit_reading_separates_modules_that_did_not_import(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite errors="1" failures="1" skipped="1" tests="4">'
        '<testcase classname="" name="tests.tensor.test_opinfo"><error message="collection failure">'
        "ImportError\nE   ModuleNotFoundError: No module named 'expecttest'</error></testcase>"
        '<testcase classname="tests.a" name="test_ok"/>'
        '<testcase classname="tests.a" name="test_bad"><failure message="assert 1 == 2&#10;more"/>'
        '</testcase><testcase classname="tests.b" name="test_s"><skipped message="x"/></testcase>'
        "</testsuite></testsuites>")
    counts, failures, uncollected = steps._junit(xml)
    assert counts == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1}
    assert failures == [("tests.a::test_bad", "assert 1 == 2")]
    assert uncollected == ["tests.tensor.test_opinfo (ModuleNotFoundError: No module named 'expecttest')"]


def test_slowest_ranks_by_speedup_over_the_faster_baseline():
    suite = {"cases": [{"name": "a", "speedup": {"vs_best": 0.9}},
                       {"name": "b", "speedup": {"vs_best": 0.1}},
                       {"name": "c", "speedup": {"vs_best": None}},
                       {"name": "d", "speedup": {"vs_best": 2.0}}]}
    assert [c["name"] for c in slowest(suite, 2)] == ["b", "a"]
    assert set(STEPS) >= {"tests", "sanitizer", "ncu"}
