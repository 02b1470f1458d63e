"""The torch.compile benchmarks (generate_compile.py, backend_overhead.py, train.py): their
argument errors in one sentence, the per-token clock, and a whole short generate run on a tiny
checkpoint (the report's rows, that ids agree and nothing compiles twice; not its speed), and the
train bench's allocator (tcmalloc preloaded by running itself again)."""
import sys
from pathlib import Path

import pytest

from strata.bench import backend_overhead, generate_compile as G, train

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from model_helpers import hf_model, write_checkpoint  # noqa: E402


@pytest.mark.parametrize("main,argv,says", [
    (G.main, ["--cache", "paged"], "--cache 'paged': choose static, dynamic or both"),
    (G.main, ["--new-tokens", "1"], "--new-tokens 1 is too small"),
    (train.main, ["--dtype", "f16"], "training is measured in f32 and/or bf16"),
    (train.main, ["--dtype", "f32,fp8"], "training is measured in f32 and/or bf16"),
    (train.main, ["--ops", "conv"], "unknown op 'conv'"),
    (backend_overhead.main, ["--ops", "conv"], "unknown op 'conv'"),
])
def test_bad_arguments_are_one_sentence(main, argv, says, capsys):
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_token_is_timed_from_the_streamer():
    s = G.Stamps()
    s.times = [0.0, 1.0, 1.5, 2.0, 2.5]          # the prompt, then four tokens 0.5 s apart
    assert s.per_token_ms() == pytest.approx(500.0)


def test_whole_short_generate_run(tmp_path):
    d = write_checkpoint(hf_model("llama", seed=3, num_hidden_layers=1), tmp_path / "tiny")
    assert G.main([str(d), "--dtype", "fp32", "--cache", "static", "--rounds", "1",
                   "--prompt-len", "4", "--new-tokens", "3", "--out", str(tmp_path / "out"),
                   "--rounds-only"]) == 0
    [report] = (tmp_path / "out").glob("generate-compile-tiny-fp32-*.md")
    rows = [line for line in report.read_text().splitlines() if line.startswith("| static |")]
    assert [r.split(" | ")[1] for r in rows] == ["eager", "inductor", "strata"]
    assert all(" | yes | " in r for r in rows)                 # ids equal eager's
    assert rows[1].endswith("| 0 |") and rows[2].endswith("| 0 |")   # nothing compiled again


def test_first_generate_in_a_new_process_finds_the_cache(tmp_path, monkeypatch):
    """The new process's first generate: strata's backend takes the programs the first process
    left in the compile cache (nothing captured or lowered: the cache holds an entry per graph,
    no more after the second run)."""
    d = write_checkpoint(hf_model("llama", seed=3, num_hidden_layers=1), tmp_path / "tiny")
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "cache"))
    args = G.build_parser().parse_args([str(d), "--dtype", "fp32", "--prompt-len", "4",
                                        "--new-tokens", "3"])
    entries = lambda: sorted((tmp_path / "cache" / "models").rglob("*.pkl"))   # noqa: E731
    assert G.first_in_new_process(args, "static", "strata") > 0
    first = entries()
    assert first
    assert G.first_in_new_process(args, "static", "strata") > 0
    assert entries() == first


def test_the_train_bench_runs_again_with_tcmalloc_unless_a_malloc_is_preloaded():
    """The baselines' best allocator: `rerun_with_tcmalloc` execs the module again with tcmalloc
    preloaded (the report's header then names it); with a malloc preloaded already it returns;
    where tcmalloc is missing it says so in one sentence and goes on."""
    import os
    import subprocess
    from strata.bench import env as E
    probe = ("import sys; from strata.bench import env as E; "
             "E.rerun_with_tcmalloc('strata.bench.no_such_module', []); print(E.allocator())")

    def run(**env):
        base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              env={**base, **env}, timeout=120)
    out = run()
    if any(Path(d, E.TCMALLOC).exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                                                  "/usr/lib/aarch64-linux-gnu", "/usr/lib")):
        assert "No module named strata.bench.no_such_module" in out.stderr   # exec'd: -m it
    else:
        assert "tcmalloc is not installed" in out.stderr and "glibc malloc" in out.stdout
    # a malloc preloaded already (the loader ignores a missing one): no exec, named as it is
    out = run(LD_PRELOAD="libnot_there_malloc.so")
    assert out.stdout.strip() == "libnot_there_malloc.so (LD_PRELOAD)", out.stderr
