"""st.autotune: configs checked against the first, survivors timed, the winner kept in the
tuning database (a second process measures nothing), wrong configs discarded and named."""
import pytest
import torch

import strata as st
from strata.tune.db import TuningDB


@st.kernel
def scale(x, out, n: int, BLOCK: st.constexpr):
    i = st.program_id(0) * BLOCK + st.thread_id(0)
    if i < n:
        out[i] = 3.0 * x[i]


CONFIGS = [{"BLOCK": 32}, {"BLOCK": 64}, {"BLOCK": 256}]


def grid_for(n):
    return lambda c: (n + c["BLOCK"] - 1) // c["BLOCK"]


def test_winner_is_recorded_and_reused(cache_dir):
    n = 1000
    x, out = torch.randn(n), torch.zeros(n)
    tuned = st.autotune(configs=CONFIGS, key=["n"])(scale)
    tuned[grid_for(n), lambda c: c["BLOCK"]](x, out, n, device="cpu")
    assert torch.equal(out, 3.0 * x)
    rows = TuningDB().rows()
    assert len(rows) == 1 and rows[0]["target"] == "cpu" and rows[0]["candidates"] == 3
    assert {"BLOCK"} == set(__import__("json").loads(rows[0]["knobs"]))

    again = st.autotune(configs=CONFIGS, key=["n"])(scale)       # as a new process would
    again.search = lambda *a, **k: pytest.fail("measured again")
    out2 = torch.zeros(n)
    again[grid_for(n), lambda c: c["BLOCK"]](x, out2, n, device="cpu")
    assert torch.equal(out2, 3.0 * x)


def test_a_wrong_config_is_discarded_and_named(cache_dir):
    n = 1000
    x, out = torch.randn(n), torch.zeros(n)
    tuned = st.autotune(configs=CONFIGS, key=["n"])(scale)
    # a grid that covers only part of the elements for BLOCK=64: its outputs differ
    grid = lambda c: (n + c["BLOCK"] - 1) // c["BLOCK"] // (2 if c["BLOCK"] == 64 else 1)
    tuned[grid, lambda c: c["BLOCK"]](x, out, n, device="cpu")
    assert torch.equal(out, 3.0 * x)
    assert len(tuned.report) == 1 and "{'BLOCK': 64}" in tuned.report[0]


def test_on_the_simulator_every_config_is_checked_and_the_first_used(cache_dir):
    n = 100
    x, out = torch.randn(n), torch.zeros(n)
    tuned = st.autotune(configs=CONFIGS, key=["n"])(scale)
    tuned[grid_for(n), lambda c: c["BLOCK"]](x, out, n, device="sim")
    assert torch.equal(out, 3.0 * x) and TuningDB().rows() == []


def test_autotune_needs_a_kernel():
    with pytest.raises(st.StrataError, match="decorates a @strata.kernel"):
        st.autotune(configs=CONFIGS)(lambda x: x)
