"""python -m strata.bench.quant_prefill: a bad size is one sentence and exit 2; a small run
writes its report with a row per format (not its speed)."""
import pytest

from conftest import HAS_CC
from strata.bench import quant_prefill


def test_a_size_under_one_is_one_sentence(capsys):
    assert quant_prefill.main(["--m", "0"]) == 2
    err = capsys.readouterr().err
    assert "must be at least 1" in err and "Traceback" not in err


@pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU programs cannot be built here")
def test_a_small_run_writes_a_row_per_format(tmp_path):
    assert quant_prefill.main(["--m", "16", "--k", "256", "--n", "16", "--rounds", "1",
                               "--out", str(tmp_path)]) == 0
    [report] = tmp_path.glob("quant-prefill-*.md")
    rows = [line for line in report.read_text().splitlines() if line.startswith("| q")]
    assert [r.split(" | ")[0][2:] for r in rows] == list(quant_prefill.FORMATS)
