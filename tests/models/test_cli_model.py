"""`strata compile MODEL`: a model directory or a bundled name, the whole model or one layer,
and the one-sentence errors."""
import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from model_helpers import hf_model, write_checkpoint  # noqa: E402
from strata.cli import main  # noqa: E402


def test_compile_model_directory_loop_ir(tmp_path, capsys):
    write_checkpoint(hf_model("smollm2"), tmp_path)
    assert main(["compile", str(tmp_path), "--ir", "loop", "--seq-len", "8"]) == 0
    out, err = capsys.readouterr()
    assert "=== k_" in out and "embed_tokens" in out
    lines = err.strip().splitlines()[-2:]
    assert lines[0].startswith(f"strata: {tmp_path} (directory {tmp_path}; 2 layers, fp32), seq 8: ")
    assert "aten ops -> loop IR in" in lines[0]
    assert lines[1] == (f"strata: weights: not loaded, compiling needs shapes only (1 safetensors "
                        f"file in {tmp_path}, checked against the config)")


def test_compile_model_without_ir_prints_a_summary_not_the_source(tmp_path, capsys):
    """Issue 51: a whole model's CUDA (145,040 lines for Qwen2.5-0.5B) went to the terminal."""
    write_checkpoint(hf_model("smollm2"), tmp_path)
    assert main(["compile", str(tmp_path), "--seq-len", "8"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].endswith(" kinds:") and " kernels for sm_90, of " in lines[0]
    assert any(line.endswith(" x k_matmul_red_attention") for line in lines[1:-1])
    assert lines[-1].startswith("print a stage with --ir: torch (") and "cuda (" in lines[-1]
    assert main(["compile", str(tmp_path), "--seq-len", "8", "-o", str(tmp_path / "m.cu")]) == 0
    assert "__global__" in (tmp_path / "m.cu").read_text()            # -o: the source, as before


def test_compile_bundled_layer_torch_ir_with_timings(capsys):
    argv = ["compile", "HuggingFaceTB/SmolLM2-135M", "--layer", "3", "--seq-len", "4",
            "--dtype", "fp16", "--ir", "torch", "-v"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "hidden_states: input (1, 4, 576) f16" in out
    assert "p_layer_self_attn_q_proj_weight: weight (576, 576) f16" in out
    assert "transformers/models/llama/modeling_llama.py:" in out       # provenance, shortened
    assert "build model" in err and "capture (torch.export)" in err    # the -v log: stderr
    assert "decoder layer 3 of 30, fp16" in err and "random weights (seed 0)" in err


@pytest.mark.parametrize("quant,rows", [("q4_0", ("q4_0",)), ("q4_k_m", ("q4_k", "q6_k"))])
def test_compile_a_quantized_layer_for_the_cpu(quant, rows, capsys):
    """q4_k_m: Q6_K for down_proj, Q4_K for the rest (576 = 2.25 super-blocks: padded)."""
    argv = ["compile", "HuggingFaceTB/SmolLM2-135M", "--layer", "1", "--seq-len", "1",
            "--quant", quant, "--target", "host", "--ir", "c"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert all(f"{fmt} blocks as vector code" in out for fmt in rows) and "_qs" in out
    assert f"linear weights quantized to {quant}" in err


@pytest.mark.parametrize("argv,words", [
    (["compile", "acme/NoSuchModel", "--ir", "torch"], "unknown model 'acme/NoSuchModel'"),
    (["compile", "Qwen/Qwen2.5-0.5B", "--layer", "24", "--ir", "torch"], "--layer 24 is out of range"),
    (["compile", "Qwen/Qwen2.5-0.5B", "-c", "torch.randn(3)"], "either MODEL or -c CODE"),
    (["compile", "-c", "torch.randn(3) * 2", "--layer", "1"], "--layer, --dtype and --quant apply to a MODEL"),
])
def test_model_errors_are_one_sentence(argv, words, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_directory_without_config_is_one_sentence(tmp_path, capsys):
    assert main(["compile", str(tmp_path), "--ir", "torch"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"strata: {tmp_path} is a directory without a config.json; a model directory "
                   f"needs one (and optionally *.safetensors weights)")
