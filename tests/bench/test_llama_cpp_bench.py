"""`python -m strata.bench.decode --gguf FILE` (issue 27; bench/llama_cpp.py): a tiny llama GGUF
written by write_gguf, timed end to end with strata, HF eager and llama.cpp where
llama-cpp-python is installed (elsewhere its row says it is not); a crash of llama.cpp's child is
a row and a retry with no_repack; a bad --gguf is one sentence and exit code 2."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from model_helpers import hf_model  # noqa: E402

from strata.bench import decode as D  # noqa: E402
from strata.bench import decode_report as R  # noqa: E402
from strata.bench import llama_cpp as L  # noqa: E402
from strata.models.gguf_write import write_gguf  # noqa: E402

HAS_LLAMA_CPP = L.installed()
NO_LLAMA_CPP = "llama-cpp-python is not installed, so llama.cpp's own run is not tested"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """1 layer, hidden 64, vocabulary 96; Q8_0 linear weights."""
    d = tmp_path_factory.mktemp("gguf")
    return write_gguf(hf_model("llama", seed=3, num_hidden_layers=1), d / "tiny-q8_0.gguf", "q8_0")


def test_gguf_run_end_to_end(tiny, tmp_path, capsys):
    """strata's row on the file's own weights (fp32 activations, float lanes: its ids are HF
    eager's; a quantized file defaults to bf16 and int8 rows), then
    llama.cpp's row, or the sentence that it is not installed; the report holds them."""
    assert D.main(["--gguf", str(tiny), "--prompt-len", "5", "--new-tokens", "3", "--repeats", "1",
                   "--rounds", "2", "--threads", "2", "--dtype", "fp32", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("decode-tiny-q8-0-fp32-*-2t-*.json")
    data = json.loads(js.read_text())
    rows = {v["name"]: v for v in data["result"]["variants"]}
    assert list(rows)[:2] == [R.STRATA, R.HF_EAGER] and R.TORCH_COMPILE not in rows
    strata = rows[R.STRATA]
    assert strata["status"] == "ok" and len(strata["ids"]) == 3 and strata["tokens_per_s"] > 0
    assert strata["ids"] == rows[R.HF_EAGER]["ids"]
    assert "loaded from GGUF file" in data["result"]["weights"]
    text = js.with_suffix(".md").read_text()
    if HAS_LLAMA_CPP:
        ran = [v for n, v in rows.items() if n.startswith(R.LLAMA_CPP) and v["status"] == "ok"]
        assert len(ran) == 1 and len(ran[0]["ids"]) == 3 and ran[0]["prefill_ms"] > 0, rows
        assert ran[0]["runs"] == strata["runs"] == 2            # a run in each of 2 rounds
        assert "2 interleaved rounds" in text
        assert f"| vs {ran[0]['name']} |" in text and "llama-cpp-python" in text
        assert next(iter(data["goals"])) == "strata decode ≥ 1.2× llama.cpp's on the same file"
    else:
        assert rows[R.LLAMA_CPP]["status"] == L.NOT_INSTALLED
        assert "| llama.cpp | — |" in text and "— (llama.cpp did not run)" in text


def test_not_installed_is_a_row(tiny, monkeypatch):
    monkeypatch.setattr(L, "installed", lambda: False)
    rows, notes = L.measure_llama_cpp(tiny, [1, 2], 3, 1, 1, say=lambda s: None)
    assert [(r.name, r.status) for r in rows] == [(R.LLAMA_CPP, L.NOT_INSTALLED)] and notes == []
    assert not rows[0].ok and "not installed" in rows[0].status


FAKE_CHILD = """import json, os, signal, sys
print("load_tensors:   CPU_Mapped model buffer size =     1.50 MiB", file=sys.stderr, flush=True)
if "--no-repack" not in sys.argv:
    os.kill(os.getpid(), signal.SIGILL)
print(json.dumps(dict(name="x", status="ok", prefill_ms=4.0, tokens_per_s=50.0, steps=2, runs=1,
                      ids=[7, 8, 9])))
"""


def test_a_crash_is_a_row_then_no_repack_runs(tiny):
    """The child dies of SIGILL as llama.cpp's AMX path did: a row says so, the retry runs."""
    rows, notes = L.measure_llama_cpp(tiny, [1, 2], 3, 1, 1, say=lambda s: None,
                                      command=[sys.executable, "-c", FAKE_CHILD])
    assert [r.name for r in rows] == [R.LLAMA_CPP, L.NO_REPACK]
    assert rows[0].status == "crashed (signal 4, SIGILL); retried with no_repack=True"
    assert rows[1].ok and rows[1].ids == [7, 8, 9] and rows[1].tokens_per_s == 50.0
    assert any("weight buffers at load: CPU_Mapped 2 MiB" in n for n in notes)
    b = R.DecodeBench("m", "w", "fp32", 2, 3, 1, 0.0, None,
                      variants=[R.DecodeVariant(R.STRATA, "ok", 2.0, 60.0, 2, 1, [7, 8, 9]), *rows])
    assert R.reference(b) == L.NO_REPACK
    assert [v for _, v in R.goals(b)][:2] == ["met (1.20× against llama.cpp (no_repack))",
                                              "met (2.00× against llama.cpp (no_repack))"]
    assert R.table_rows(b)[1][-1] == "crashed (signal 4, SIGILL); retried with no_repack=True"


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason=NO_LLAMA_CPP)
def test_no_repack_loads_without_extra_buffers(tiny):
    """no_repack: the weights stay in llama.cpp's plain CPU buffers (no AMX, no CPU_REPACK), and
    greedy ids are the default path's where that one runs."""
    plain, buffers = L._child(tiny, [1, 2, 3], 2, 1, 1, True, None)
    assert plain.ok and len(plain.ids) == 2 and "CPU" in buffers, (plain.status, buffers)
    assert "AMX" not in buffers and "REPACK" not in buffers, buffers
    default, _ = L._child(tiny, [1, 2, 3], 2, 1, 1, False, None)
    assert default.ids == plain.ids or default.status.startswith("crashed"), default.status


@pytest.mark.parametrize("argv, says", [
    (["--gguf", "/no/such.gguf"], "no such file"),
    (["--gguf", __file__], "is not a GGUF file"),
    (["some/model", "--gguf", "TINY"], "give MODEL or --gguf, not both"),
    (["--gguf", "TINY", "--quant", "q8_0"], "--quant does not apply to --gguf"),
    (["--gguf", "TINY", "--device", "cuda"], "on the CPU"),
    (["--gguf", "TRUNCATED"], "truncated or corrupt"),
])
def test_bad_gguf_is_one_sentence_and_exit_2(argv, says, tiny, tmp_path, capsys):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:200])
    argv = [{"TINY": str(tiny), "TRUNCATED": str(cut)}.get(a, a) for a in argv]
    assert D.main(argv + ["--out", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert says in out.err and len(out.err.strip().splitlines()) == 1 and "Traceback" not in out.err


def test_no_hf_skips_eager_with_a_row(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(L, "installed", lambda: False)
    assert D.main(["--gguf", str(tiny), "--dtype", "bf16", "--no-hf", "--prompt-len", "4",
                   "--new-tokens", "2", "--repeats", "1", "--threads", "2", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("decode-tiny-q8-0-bf16-*.json")
    rows = {v["name"]: v for v in json.loads(js.read_text())["result"]["variants"]}
    assert rows[R.STRATA]["status"] == "ok" and rows[R.HF_EAGER]["status"] == "skipped (--no-hf)"


def test_rounds_take_medians_and_list_each_ratio():
    """decode_rounds.py: strata and llama.cpp in turn; the rows are medians of the rounds, the note
    shows the drift; a failed round leaves the first round's rows and says why."""
    from strata.bench.decode_rounds import more_rounds
    first = [R.DecodeVariant(R.STRATA, "ok", 10.0, 40.0, 3, 1, [1]),
             R.DecodeVariant(R.LLAMA_CPP, "ok", 12.0, 50.0, 3, 1, [2])]
    ours = iter([([1], 0.011, 3 / 45.0, 3), ([1], 0.009, 3 / 30.0, 3)])       # 45, then 30 tokens/s
    theirs = iter([R.DecodeVariant(R.LLAMA_CPP, "ok", 11.0, 45.0, 3, 1, [2]),
                   R.DecodeVariant(R.LLAMA_CPP, "ok", 13.0, 40.0, 3, 1, [2])])
    rows, (note,) = more_rounds(first, lambda n: next(ours), lambda: [next(theirs)], 3, 3, 1, print)
    assert [(r.name, r.tokens_per_s, r.prefill_ms, r.runs) for r in rows] == [
        (R.STRATA, 40.0, 10.0, 3), (R.LLAMA_CPP, 45.0, 12.0, 3)]
    assert note.endswith("0.80x, 1.00x, 0.75x")
    rows, (note,) = more_rounds(first, lambda n: 1 / 0, lambda: [], 2, 3, 1, print)
    assert rows == first and "not counted" in note
