"""`python -m strata.bench.decode` (issue 5's GPU table): bytes per token against a hand count,
the bandwidth limit, goals and table from given numbers, the whole run on the CPU with a tiny
checkpoint (strata on the simulator), the no-GPU exit; a short run where a GPU exists."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from strata.bench import decode as D
from strata.bench import decode_report as R
from strata.bench.results import Env

pytest.importorskip("transformers")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "models"))
from model_helpers import config_dict, hf_model, write_checkpoint

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _hand_count_params(c: dict) -> int:
    h, i, v, layers = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h       # q,k,v,o, gate/up/down, 2 norms
    if c["model_type"] == "qwen2":
        per_layer += q + 2 * kv                                       # q/k/v bias
    embeddings = v * h if c["tie_word_embeddings"] else v * h + h  # untied: the head + one row
    return embeddings + layers * per_layer + h                      # embeddings, layers, final norm


@pytest.mark.parametrize("family", ["llama", "qwen2", "llama3"])
def test_weight_bytes_match_a_hand_count(family):
    model = hf_model(family)
    assert R.weight_bytes(model) == 4 * _hand_count_params(config_dict(family))
    assert R.weight_bytes(model.to(torch.bfloat16)) == 2 * _hand_count_params(config_dict(family))


def test_kv_bytes_at_the_average_position():
    cfg = SimpleNamespace(**config_dict("llama3"))        # 2 layers, 2 kv heads of 16
    assert R.average_kv_len(128, 256) == 256              # steps read 129 .. 383 keys
    assert R.average_kv_len(5, 3) == 6.5                  # steps at positions 5, 6: 6 and 7 keys
    assert R.kv_bytes_per_token(cfg, 2, 128, 256) == 2 * 2 * 2 * 16 * 2 * 256
    cfg = SimpleNamespace(**config_dict("llama"))         # no head_dim: hidden / heads = 16
    assert R.kv_bytes_per_token(cfg, 4, 10, 2) == 2 * 2 * 2 * 16 * 4 * 11


def _bench(strata_tps=100.0, compile_tps=80.0, eager_tps=20.0, copy=1000.0, strata_ids=(1, 2, 3)):
    vs = [R.DecodeVariant(R.STRATA, "ok", 5.0, strata_tps, 2, 3, list(strata_ids)),
          R.DecodeVariant(R.HF_EAGER, "ok", 9.0, eager_tps, 2, 3, [1, 2, 3]),
          R.DecodeVariant(R.TORCH_COMPILE, "ok", 7.0, compile_tps, 2, 3, [1, 2, 4])]
    return R.DecodeBench("tiny (bundled config; 2 layers, bf16)", "random (seed 0)", "bf16", 4, 3,
                         int(9e9), 1e9, copy, "sdpa", vs)


def test_limit_fraction_and_goals():
    b = _bench()
    assert b.bytes_per_token == 10e9 and b.limit_tokens_per_s == pytest.approx(100.0)
    assert R.fraction_of_limit(b, R.STRATA) == pytest.approx(1.0)
    assert R.vs(b, R.STRATA, R.TORCH_COMPILE) == pytest.approx(1.25)
    assert R.goals(b) == [("strata decode ≥ 2.5× torch.compile", "not met (1.25×)"),
                          ("strata ≥ 75% of the bandwidth limit", "met (100%)"),
                          ("strata prefill ≥ 1× torch.compile's (4 tokens, compiled)", "met (1.40×)")]
    fast = _bench(compile_tps=40.0)
    assert R.goals(fast)[0] == ("strata decode ≥ 2.5× torch.compile", "met (2.50×)")
    slow = _bench(strata_tps=74.0)
    slow.variants[0].prefill_ms = 10.0
    assert [v for _, v in R.goals(slow)] == ["not met (0.93×)", "not met (74%)", "not met (0.70×)"]
    failed = _bench()
    failed.variants[0] = R.DecodeVariant(R.STRATA, "unsupported: op x")
    assert [v for _, v in R.goals(failed)] == ["not met (strata unsupported)"] * 3
    no_compile = _bench()
    no_compile.variants[2] = R.DecodeVariant(R.TORCH_COMPILE, "failed: x")
    assert R.goals(no_compile)[2][1] == "— (torch.compile did not run)"
    on_cpu = _bench()
    on_cpu.device = "cpu"
    assert len(R.goals(on_cpu)) == 2           # the CPU's prefill is uncompiled (generate's)


def test_table_and_markdown(tmp_path):
    b = _bench()
    rows = R.table_rows(b)
    assert rows[0] == ("strata", "5.00", "100.0", "10.000", "1.25×", "100%", "—")
    assert rows[1][-1] == "yes"
    assert rows[2][-1] == "no (first difference at generated token 2)"
    env = Env("NVIDIA Fake GPU", "2030-01-02T03:04:05+00:00", "2.13", "12.8", "0.1")
    md, js = R.write(tmp_path, D.stem("TinyLlama/TinyLlama-1.1B-Chat-v1.0", env, "bf16"), b, env)
    assert md.name == "decode-tinyllama-1-1b-chat-v1-0-bf16-nvidia-fake-gpu-2030-01-02.md"
    text = md.read_text()
    assert "weights: random (seed 0)" in text and "device: NVIDIA Fake GPU" in text
    assert "bandwidth limit: 100.0 tokens/s" in text and "HF variants' attention: sdpa" in text
    assert "goal: strata decode ≥ 2.5× torch.compile: **not met (1.25×)**" in text
    assert "| strata | 5.00 | 100.0 | 10.000 | 1.25× | 100% | — |" in text
    data = json.loads(js.read_text())
    assert data["limit_tokens_per_s"] == pytest.approx(100.0)
    assert data["result"]["variants"][2]["ids"] == [1, 2, 4]


def test_measure_takes_medians_and_turns_a_failure_into_a_row():
    times = iter([(0.010, 1.0), (0.030, 0.5), (0.020, 2.0)])

    def run(n):
        p, d = next(times)
        return list(range(n)), p, d, n - 1
    v = D.measure("x", run, 5, repeats=3, warmups=())
    assert v.ok and v.prefill_ms == pytest.approx(20.0) and v.tokens_per_s == pytest.approx(4.0)
    assert v.ids == [0, 1, 2, 3, 4] and v.runs == 3 and v.steps == 4

    def boom(n):
        raise RuntimeError("out of memory\nmore")
    v = D.measure("x", boom, 5, repeats=1)
    assert not v.ok and v.status == "failed: RuntimeError: out of memory"


def test_prompt_ids_are_fixed_and_in_the_vocabulary():
    a = D.prompt_ids(100, 50)
    assert a == D.prompt_ids(100, 50) and len(a) == 50 and all(0 <= i < 100 for i in a)


def test_whole_run_on_the_cpu(tmp_path):
    """Every variant through the real loops: strata natively on the CPU, torch.compile's loop with
    the static cache under dynamo's eager backend; fp32, so the greedy ids must all agree.
    strata and HF eager take 2 rounds in turn (decode_rounds.py), torch.compile one."""
    d = write_checkpoint(hf_model("llama", seed=3), tmp_path / "tiny")
    args = D.build_parser().parse_args([str(d), "--prompt-len", "5", "--new-tokens", "4",
                                        "--dtype", "fp32", "--repeats", "1", "--rounds", "2"])
    compile_fn = lambda fn: torch.compile(fn, backend="eager", dynamic=False)
    b = D.run_bench(args, say=lambda s: None, device="cpu", copy_gbps=1.0, compile_fn=compile_fn)
    assert [v.name for v in b.variants] == [R.STRATA, R.HF_EAGER, R.TORCH_COMPILE]
    assert all(v.ok for v in b.variants), [v.status for v in b.variants]
    ids = [v.ids for v in b.variants]
    assert len(ids[0]) == 4 and ids[0] == ids[1] == ids[2]
    assert [v.runs for v in b.variants] == [2, 2, 1]
    assert any(note.startswith("2 interleaved rounds (strata, then HF eager") and "prefill" in note
               for note in b.notes), b.notes
    assert "loaded from" in b.weights and b.hf_attention == "sdpa"
    assert b.weight_bytes == 4 * _hand_count_params(config_dict("llama"))
    assert b.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4 * 7


def test_a_compiled_prefill_runs_through_the_compiled_function():
    """compile_prefill (the GPU bench's torch.compile row): the prompt goes through the compiled
    function too, a graph of its own shape, and the ids are eager's."""
    from strata.bench.decode_loops import StaticCompiled, hf_eager_greedy
    lm = hf_model("llama", seed=4).eval()
    shapes = []

    def compile_fn(fn):
        compiled = torch.compile(fn, backend="eager", dynamic=False)
        return lambda ids, positions: shapes.append(tuple(ids.shape)) or compiled(ids, positions)

    def keys(cache):  # transformers 5.x makes a layer's tensors on its first update
        return [getattr(layer, "keys", None) for layer in getattr(cache, "layers", [])]
    run = StaticCompiled(lm, 12, "cpu", compile_fn, compile_prefill=True)
    made = keys(run.cache)
    assert all(k is not None and k.numel() for k in made)  # before any compiled call (a CUDA
    # graph's first run would own them and overwrite them at its next replay: H200 run 6)
    ids, *_ = run([3, 1, 4, 1, 5], 4)
    assert shapes[0] == (1, 5) and set(shapes[1:]) == {(1, 1)}
    assert ids == hf_eager_greedy(lm, [3, 1, 4, 1, 5], 4, device="cpu")[0]
    assert all(a is b for a, b in zip(made, keys(run.cache)))


@no_gpu
def test_without_gpu_exits_2_with_one_sentence():
    out = subprocess.run([sys.executable, "-m", "strata.bench.decode"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "GPU" in lines[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize("argv, says", [(["no/such-model"], "unknown model"),
                                        (["--new-tokens", "0"], "--new-tokens must be at least 1")])
def test_bad_arguments_are_one_sentence(argv, says, capsys):
    assert D.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


@gpu
def test_short_run_on_the_gpu(tmp_path):
    assert D.main(["HuggingFaceTB/SmolLM2-135M", "--prompt-len", "16", "--new-tokens", "8",
                   "--repeats", "1", "--out", str(tmp_path)]) == 0
    (js,) = tmp_path.glob("decode-*.json")
    data = json.loads(js.read_text())
    assert [v["name"] for v in data["result"]["variants"]] == ["strata", "HF eager", "torch.compile"]
    assert data["limit_tokens_per_s"] > 0


def test_cpu_goals_are_against_the_faster_baseline():
    b = _bench()                     # strata 100 tokens/s, torch.compile 80, eager 20
    b.device = "cpu"
    assert R.goals(b)[0] == ("strata decode ≥ 1.5× the faster of HF eager and torch.compile",
                             "not met (1.25×)")
    b.dtype = "fp32"
    assert R.goals(b)[0][1] == "met (1.25×)"
    md = R.markdown(b, Env(device="AMD EPYC, 2 cores", date="2026-11-24T00:00:00+00:00",
                           extra={"threads": "2"}))
    assert "native C + OpenMP kernels" in md and "a large sum reading" in md
    assert "reduce-overhead" not in md


def test_cpu_decodes_32_tokens_by_default():
    args = D.build_parser().parse_args(["--device", "cpu"])
    D.check_args(args)
    assert args.new_tokens == 32
    args = D.build_parser().parse_args([])
    D.check_args(args)
    assert args.new_tokens == 256
