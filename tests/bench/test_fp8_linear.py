"""python -m strata.bench.fp8_linear: bad rows are one sentence and exit 2; a small run writes
its report with a row per activation count, strata's error against eager's FP8 layer small (not
its speed)."""
import pytest

from conftest import HAS_CC
from strata.bench import fp8_linear


@pytest.mark.parametrize("rows", ["0", "a,b", ""])
def test_bad_rows_are_one_sentence(capsys, rows):
    assert fp8_linear.main(["--rows", rows]) == 2
    err = capsys.readouterr().err
    assert "must be at least 1" in err and "Traceback" not in err


@pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU programs cannot be built here")
def test_a_small_run_writes_a_row_per_count(tmp_path):
    assert fp8_linear.main(["--k", "64", "--n", "48", "--rows", "1,5", "--rounds", "1",
                            "--out", str(tmp_path)]) == 0
    [report] = tmp_path.glob("fp8-linear-*.md")
    rows = [line.split(" | ") for line in report.read_text().splitlines()
            if line.startswith("| 1 ") or line.startswith("| 5 ")]
    assert [r[0][2:].strip() for r in rows] == ["1", "5"]
    assert all(float(r[-1].strip(" |")) < 1e-2 for r in rows)
