"""`strata view` on the command line: the page's path on stdout, the verdict with --device cpu,
--serve, and bad input as one sentence with a non-zero exit."""
import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from conftest import HAS_CC
from strata.cli import main

RMSNORM = "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))"


def page_data(path) -> dict:
    html = open(path, encoding="utf-8").read()
    return json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>',
                                html, re.S)[1])


def test_writes_the_page_and_prints_its_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["view", "-c", RMSNORM]) == 0
    out, err = capsys.readouterr()
    assert out == "strata-view.html\n" and (tmp_path / "strata-view.html").stat().st_size > 1000
    assert re.match(r"strata: 1 kernels, [\d.]+ MB page in [\d.]+ s\n$", err)


def test_device_cpu_shows_the_float64_verdict(tmp_path, capsys):
    if not HAS_CC:
        pytest.skip("no C compiler: --device cpu cannot run here")
    path = tmp_path / "r.html"
    assert main(["view", "-c", RMSNORM, "--device", "cpu", "-o", str(path)]) == 0
    data = page_data(path)
    assert data["target"] == "host" and "c" in [s["name"] for s in data["stages"]]
    verdict = data["verdict"]
    assert verdict["passed"] and verdict["outputs"][0]["rel"] < 1e-5
    assert "verdict PASS" in capsys.readouterr().err


@pytest.mark.parametrize("argv, sentence", [
    (["view"], "strata: nothing to view: give MODEL or -c CODE"),
    (["view", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "-c", "torch.randn(3)"],
     "strata: give either MODEL or -c CODE, not both"),
    (["view", "-c", "torch.randn(3) + 1", "--layer", "0"],
     "strata: --layer, --dtype and --quant apply to a MODEL; -c snippets take their own dtypes"),
    (["view", "-c", "torch.randn(3) + 1", "-o", "/no/such/dir/p.html"],
     "strata: cannot write /no/such/dir/p.html: its directory does not exist"),
    (["view", "-c", "torch.nosuchop(torch.randn(3))"], "strata: the snippet failed to evaluate: "
     "AttributeError: module 'torch' has no attribute 'nosuchop'"),
    (["view", "-c", "torch.randn(3) + 1", "--knob", "VEC=3"],
     "strata: knob VEC=3 is not allowed: VEC takes a power of two from 1 to 64"),
])
def test_bad_input_is_one_sentence(argv, sentence, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) != 0
    out, err = capsys.readouterr()
    assert out == "" and err == sentence + "\n"
    assert not (tmp_path / "strata-view.html").exists()


def test_unknown_model_is_one_sentence(capsys):
    assert main(["view", "NoSuch/Model"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("strata: unknown model 'NoSuch/Model'") and err.count("\n") == 1


def test_serve_answers_with_the_page(tmp_path):
    path = tmp_path / "s.html"
    proc = subprocess.Popen([sys.executable, "-m", "strata.cli", "view", "-c", "torch.randn(8) * 2",
                             "-o", str(path), "--serve"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stdout.readline() == f"{path}\n"
        url = proc.stdout.readline().strip()
        assert re.match(r"http://127\.0\.0\.1:\d+/$", url)
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.read() == path.read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_device_sim_shows_the_verdict_and_the_simulators_counters(tmp_path):
    path = tmp_path / "s.html"
    assert main(["view", "-c", "torch.softmax(torch.randn(64, 256), -1)", "--device", "sim",
                 "-o", str(path)]) == 0
    data = page_data(path)
    assert data["verdict"]["passed"]
    (k,) = data["kernels"]
    counters = dict(data["counters"][k["name"]])
    assert counters["global store: sectors per request, actual / ideal"] == "1.00"
    assert int(counters["lane operations"]) > 64 * 256


def test_bench_times_the_program_and_each_kernel(tmp_path, capsys, monkeypatch):
    if not HAS_CC:
        pytest.skip("no C compiler: --device cpu cannot run here")
    from strata.tune.machine import Profile
    profile = Profile("a CPU", "", "x86_64", 2, [], {}, "cpu-spr",
                      {"DRAM read": 20.0, "fp32 FMA peak": 500.0}, "2026-01-01 00:00 UTC")
    monkeypatch.setattr("strata.tune.machine.cached", lambda: profile)
    monkeypatch.setattr("strata.bench.machine_probes.measure", None)       # the page never measures
    path = tmp_path / "b.html"
    assert main(["view", "-c", "torch.softmax(torch.randn(64, 256), -1) * 2", "--device", "cpu",
                 "--bench", "-o", str(path)]) == 0
    data = page_data(path)
    bench = data["bench"]
    assert set(bench["whole"]) == {"eager", "torch.compile", "strata"}
    assert all(ms > 0 for ms in bench["whole"].values())
    assert set(bench["kernels"]) == {k["name"] for k in data["kernels"]}
    roof = data["roofline"]
    assert [p["name"] for p in roof["points"]] == [k["name"] for k in data["kernels"]]
    assert roof["svg"].count("<circle ") == len(data["kernels"]) and roof["ceilings"] == profile.ceilings
    assert main(["view", "-c", "torch.randn(3) * 2", "--bench"]) != 0
    assert capsys.readouterr().err.endswith("strata: --bench times native kernels here: add --device cpu\n")
