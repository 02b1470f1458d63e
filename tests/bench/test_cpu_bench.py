"""`strata run --device cpu --bench`: the verdict, then eager / torch.compile / strata timed in
interleaved rounds on the same inputs (few rounds here: the table, not the numbers, is tested)."""
import pytest

from strata.bench import cpu_bench
from strata.cli import main
from conftest import HAS_CC

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler (cc, gcc or clang) on PATH")


def test_cpu_bench_prints_every_variant_after_the_verdict(monkeypatch, capsys):
    monkeypatch.setattr(cpu_bench, "ROUNDS", 3)
    monkeypatch.setattr(cpu_bench, "MIN_ROUND_S", 0.001)
    monkeypatch.setattr(cpu_bench, "copy_gbps", lambda: 10.0)
    assert main(["run", "-c", "torch.softmax(torch.randn(64, 512), -1)", "--device", "cpu",
                 "--bench"]) == 0
    out = capsys.readouterr().out
    assert out.index("PASS") < out.index("CPU timings")
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["k_softmax_reduce", "eager", "torch.compile", "strata"]


def test_interleaved_medians_time_each_variant():
    calls = []
    ms = cpu_bench.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, (),
                               rounds=2)
    assert set(ms) == {"a", "b"} and all(t > 0 for t in ms.values())
    assert calls[:2] == ["a", "b"]         # warm-up of each, then rounds that alternate


@pytest.mark.parametrize("share, warned", [(0.6, True), (0.05, False)])
def test_timings_on_a_busy_machine_say_so_in_the_table(share, warned, monkeypatch, capsys):
    """Issue 29: under load --bench printed strata 342x eager with no warning."""
    class Load:
        def __init__(self, pids=()):
            pass

        def share(self):
            return share
    monkeypatch.setattr(cpu_bench, "OtherLoad", Load)
    monkeypatch.setattr(cpu_bench, "ROUNDS", 3)
    monkeypatch.setattr(cpu_bench, "MIN_ROUND_S", 0.001)
    monkeypatch.setattr(cpu_bench, "copy_gbps", lambda: 10.0)
    assert main(["run", "-c", "torch.softmax(torch.randn(8, 64), -1)", "--device", "cpu",
                 "--bench"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("warning: other processes took 60% of the CPU while this was timed" in out) == warned
