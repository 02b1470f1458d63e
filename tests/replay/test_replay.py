"""Process replay: the CUDA of every corpus program (tests/replay/corpus.py) hashes as recorded
in baseline.json. A refactor that must not change the emitted code proves it here; an intended
change rewrites the baseline with `python -m tests.replay.record`."""
import json

import pytest

from corpus import cases
from record import BASELINE, digest

CASES = cases()
WANT = json.loads(BASELINE.read_text())


def test_corpus_and_baseline_name_the_same_programs():
    assert sorted(CASES) == sorted(WANT)


@pytest.mark.parametrize("name", sorted(CASES))
def test_emitted_cuda_is_unchanged(name):
    assert digest(CASES[name]()) == WANT[name], (
        f"{name}: the emitted CUDA changed; if intended, run `python -m tests.replay.record`")
