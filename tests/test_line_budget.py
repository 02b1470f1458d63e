"""The compiler core stays within the line budget of .ci/line_budget.json (see .ci/line_budget.py)."""
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / ".ci" / "line_budget.py"


def test_every_stage_is_within_its_line_budget():
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tile (schedules)" in run.stdout and "total" in run.stdout
