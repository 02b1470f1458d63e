"""`python -m strata.bench.busy`: the variants it compares, its argument errors, and a whole short
run on a tiny checkpoint beside one busy process (the report's rows and columns, not its speed)."""
import sys
from pathlib import Path

import pytest

from strata.bench import busy as B
from strata.core.errors import StrataError
from strata.runtime.threads import THREADS

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from model_helpers import hf_model, write_checkpoint  # noqa: E402


def test_variants_are_the_default_and_fixed_counts():
    assert B.variants(2) == {"default": None, "1 thread": 1, "2 threads": 2}
    assert list(B.variants(6).values()) == [None, 1, 2, 4, 6]
    assert list(B.variants(1).values()) == [None, 1]


@pytest.mark.parametrize("text", ["", "a,b", "0,-1"])
def test_bad_busy_levels_are_one_sentence(text):
    with pytest.raises(StrataError, match="--busy"):
        B.busy_levels(text)


def test_busy_processes_stop():
    procs = B.start_busy(1, max_s=30)
    assert procs[0].poll() is None
    B.stop_busy(procs)
    assert procs[0].poll() is not None


def test_whole_short_run(tmp_path):
    d = write_checkpoint(hf_model("llama", seed=3, num_hidden_layers=1), tmp_path / "tiny")
    assert B.main([str(d), "--dtype", "fp32", "--busy", "0,1", "--rounds", "1", "--prompt-len",
                   "4", "--new-tokens", "3", "--out", str(tmp_path / "out")]) == 0
    [report] = (tmp_path / "out").glob("busy-tiny-fp32-*.md")
    text = report.read_text()
    assert "| busy processes | default tok/s | 1 thread tok/s |" in text
    rows = [line for line in text.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert len(rows) == 2
    assert THREADS.fixed is None            # the run leaves the default team behind
