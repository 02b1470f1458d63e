"""GGUF files (strata/models/gguf_file.py, gguf_write.py) and `--quant` at load: a tiny Llama
written as F32, F16, BF16, Q8_0 and Q4_0 and read back (the weights are what the gguf package
dequantizes, the q/k rope permutation undone, eager logits those of the original model with the
same rounded weights), generated from with strata against eager, kept quantized in memory; each
bad file or name is one sentence."""
import copy

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

import torch  # noqa: E402

from conftest import HAS_CC  # noqa: E402
from model_helpers import hf_model, write_checkpoint  # noqa: E402
from strata.cli import main  # noqa: E402
from strata.core.context import Context  # noqa: E402
from strata.models import compile_cache, hf  # noqa: E402
from strata.models.build import build  # noqa: E402
from strata.models.gguf_file import GGUFFile  # noqa: E402
from strata.models.gguf_names import gguf_name, rope_rows  # noqa: E402
from strata.models.gguf_write import FORMATS, write_gguf  # noqa: E402
from strata.quant.formats import QuantLinear, dequantize, quantize_weight  # noqa: E402

DEVICE = "cpu" if HAS_CC else "sim"
BLOCKS = tuple(f for f in FORMATS if not f.endswith("_k_m"))   # one type for every 2-d weight


@pytest.fixture(scope="module")
def ref():
    """3 layers, so that decoding repeats the second layer (layer_replica.py) with QuantLinears."""
    return hf_model("llama", seed=5, vocab_size=128, num_hidden_layers=3)


@pytest.fixture(scope="module")
def files(ref, tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return {fmt: write_gguf(ref, d / f"tiny-{fmt}.gguf", fmt) for fmt in BLOCKS}


def _rounded(ref, fmt: str):
    """`ref` with every 2-d weight replaced by the value `fmt` stores for it."""
    model = copy.deepcopy(ref)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and fmt in ("f16", "bf16"):
                p.copy_(p.to(torch.float16 if fmt == "f16" else torch.bfloat16).float())
            elif p.dim() == 2 and fmt != "f32":
                p.copy_(dequantize(*quantize_weight(p, fmt), fmt))
    return model


@pytest.mark.parametrize("fmt", BLOCKS)
def test_round_trip(fmt, ref, files):
    lm = build(str(files[fmt]), dtype="fp32", materialise=True).model
    by_name = {t.name: t for t in gguf.GGUFReader(files[fmt]).tensors}
    heads, kv_heads = ref.config.num_attention_heads, ref.config.num_key_value_heads
    quant = {n: m for n, m in lm.named_modules() if isinstance(m, QuantLinear)}
    assert len(quant) == (7 * 3 + 1 if fmt.startswith("q") else 0)        # lm_head too
    for name, mod in quant.items():
        t = by_name[gguf_name(name + ".weight")]
        want = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type))
        if name.endswith(("q_proj", "k_proj")):            # the file's rows are rope-permuted
            want = rope_rows(want, heads if name.endswith("q_proj") else kv_heads, to_gguf=False)
        assert torch.equal(mod.weight(torch.float32), want), name
    if fmt.startswith("q"):                                # the bytes are gguf's own quantization
        w = ref.model.layers[1].mlp.up_proj.weight.detach().numpy()
        kind = gguf.GGMLQuantizationType[fmt.upper()]
        assert np.array_equal(by_name["blk.1.ffn_up.weight"].data, gguf.quants.quantize(w, kind))
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits, _rounded(ref, fmt)(ids).logits,
                                   rtol=1e-5, atol=1e-5)


def test_weights_equal_transformers_own_gguf_loader(files):
    """An independent reader of the same file (transformers' GGUF loader: its own names, q/k
    un-permutation and dequantization) gives the same weights."""
    utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    path = str(files["q4_0"])
    built = build(path, dtype="fp32", materialise=True)
    meta = hf.from_config(built.config, torch.float32, device="meta")
    try:
        theirs = utils.load_gguf_checkpoint(path, return_tensors=True, model_to_load=meta)["tensors"]
    except TypeError:
        pytest.skip("this transformers' load_gguf_checkpoint takes no model_to_load")
    params = dict(built.model.named_parameters())
    assert len(theirs) == 3 * 9 + 3
    for name, t in theirs.items():
        mod = built.model.get_submodule(name.rpartition(".")[0])
        ours = mod.weight(torch.float32) if isinstance(mod, QuantLinear) else params[name]
        assert torch.equal(t.float(), ours), name


def test_llama3_rope_scaling_round_trip(tmp_path):
    """Llama-3 rope scaling travels as llama.cpp's rope_freqs tensor (divisors of inv_freq)."""
    ref = hf_model("llama3", seed=4)
    lm = build(str(write_gguf(ref, tmp_path / "l3.gguf", "f32")), materialise=True).model
    ids = torch.randint(0, ref.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)


def test_compile_one_layer_prints_the_quantized_loads(files, capsys):
    rc = main(["compile", str(files["q8_0"]), "--layer", "0", "--seq-len", "4", "--ir", "loop"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "load b_layer_self_attn_q_proj_qs_and_2[" in out and "load b_layer_mlp_down_proj_d[" in out
    assert "decoder layer 0 of 3" in err and "not loaded, compiling needs shapes only" in err


def test_default_dtype_follows_the_file(files):
    assert build(str(files["f16"])).dtype == "fp16"
    assert build(str(files["bf16"])).dtype == "bf16"
    assert build(str(files["q8_0"])).dtype == "bf16"      # quantized: bf16 activations (int8 rows)
    assert build(str(files["q8_0"]), dtype="fp32").dtype == "fp32"


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_generate_agrees_with_eager(fmt, files, capsys):
    rc = main(["generate", str(files[fmt]), "--prompt-ids", "1,5,9,77,3",
               "--max-new-tokens", "5", "--device", DEVICE, "--compare"])
    out = capsys.readouterr().out
    kind = fmt.upper()
    assert rc == 0, out
    assert f"{kind} and F32" in out and f"token_embd.weight is {kind}, dequantized" in out
    verdict = next(line for line in out.splitlines() if line.startswith("ids agree with hf eager"))
    assert verdict.endswith((": yes", "rounding tipped", ": near ties")), verdict   # int8 rows


def test_generate_without_a_prompt_uses_the_files_tokenizer(files, capsys):
    """Issue 51: a GGUF file that carries a tokenizer needed --prompt or --prompt-ids."""
    rc = main(["generate", str(files["q8_0"]), "--max-new-tokens", "2", "--device", DEVICE])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "strata: no prompt given: 'Once upon a time', encoded by" in err and "  text: " in out


def test_quant_at_load(tmp_path, capsys):
    smol = hf_model("smollm2", seed=2, num_hidden_layers=1)                   # tied embeddings
    d = write_checkpoint(smol, tmp_path / "smol")
    rc = main(["generate", str(d), "--quant", "q8_0", "--prompt-ids", "1,5,9",
               "--max-new-tokens", "4", "--device", DEVICE, "--compare"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "quantized to q8_0 at load (lm_head kept as it is: tied" in out
    assert "ids agree with hf eager (cpu): yes" in out
    rc = main(["generate", str(d), "--quant", "int4", "--prompt-ids", "1,5,9",
               "--max-new-tokens", "4", "--device", DEVICE, "--compare"])
    out = capsys.readouterr().out
    assert rc == 0 and "ids agree with hf eager (cpu): yes" in out, out
    untied = write_checkpoint(hf_model("llama", seed=2), tmp_path / "llama")
    built = build(str(untied), materialise=True, quant="q4_0")
    assert isinstance(built.model.lm_head, QuantLinear) and "(lm_head too)" in built.weights


def test_quantized_weights_stay_quantized(ref, files):
    """No float copy of a quantized weight: the model holds the Q8_0 blocks' bytes, the
    (dequantized) embedding and the norms in bf16 (the default activations), a third of the
    float32 model."""
    lm = build(str(files["q8_0"]), materialise=True).model
    state = [*lm.parameters(), *lm.buffers()]
    held = sum(t.numel() * t.element_size() for t in state)
    assert not [n for n, _ in lm.named_parameters() if n.endswith(("proj.weight", "lm_head.weight"))]
    linear = sum(p.numel() for n, p in ref.named_parameters() if n.endswith("proj.weight")
                 or n == "lm_head.weight")
    rest = sum(p.numel() * 2 for n, p in ref.named_parameters() if "proj" not in n
               and n != "lm_head.weight")
    rotary = sum(b.numel() * 4 for b in lm.model.rotary_emb.buffers())
    assert held == linear * 34 // 32 + rest + rotary
    assert held < 0.4 * sum(p.numel() * 4 for p in ref.parameters())


def test_compile_cache_keys_differ_by_weight_format(files):
    ctx, ids = Context(), (torch.zeros((1, 4), dtype=torch.long),)

    def key(fmt):
        return compile_cache.cache_key(build(str(files[fmt]), dtype="bf16").model, "prefill",
                                       ids, ctx, None)
    keys = {fmt: key(fmt) for fmt in BLOCKS}
    assert keys["f32"] == keys["f16"] == keys["bf16"]     # all bf16 models: the same program
    assert len({keys["f32"], keys["q8_0"], keys["q4_0"]}) == 3
    assert key("q8_0") == keys["q8_0"]                    # and stable: the cache is reused


def test_tokenizer_from_the_file(files):
    tok = GGUFFile(files["q8_0"]).tokenizer()
    ids = tok("hello world")["input_ids"]
    assert ids[0] == 1 and tok.decode(ids, skip_special_tokens=True) == "hello world"


def _patched(src, dst, edit):
    """A copy of GGUF file `src` with `edit(reader)` applied to its memory map (r+)."""
    dst.write_bytes(src.read_bytes())
    reader = gguf.GGUFReader(dst, "r+")
    edit(reader)
    reader.data.flush()
    return dst


def _set_type(name, kind):
    def edit(reader):
        t = next(t for t in reader.tensors if t.name == name)
        t.field.parts[4][0] = kind                 # the tensor's GGML type, in place
    return edit


def _set_field(key, value):
    def edit(reader):
        reader.fields[key].parts[-1][:] = value
    return edit


@pytest.fixture(scope="module")
def bad_files(files, tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    wide = write_gguf(hf_model("llama", intermediate_size=256), d / "wide.gguf", "q8_0")
    q8 = files["q8_0"]
    (d / "cut.gguf").write_bytes(q8.read_bytes()[:q8.stat().st_size * 9 // 10])
    return {
        "iq4_nl": _patched(wide, d / "iq4.gguf",               # an i-quant: refused
                           _set_type("blk.0.ffn_down.weight", gguf.GGMLQuantizationType.IQ4_NL)),
        "arch": _patched(q8, d / "qwen2.gguf", _set_field("general.architecture",
                                                          np.frombuffer(b"qwen2", np.uint8))),
        "layers": _patched(q8, d / "four.gguf", _set_field("llama.block_count", 4)),
        "tokenizer": _patched(q8, d / "tok.gguf", _set_field("tokenizer.ggml.model",
                                                             np.frombuffer(b"xxxxx", np.uint8))),
        "cut": d / "cut.gguf",
        "text": d / "not.gguf",
    }


IDS = ["--prompt-ids", "1,2"]


@pytest.mark.parametrize("which, args, says", [
    ("iq4_nl", IDS, "tensor blk.0.ffn_down.weight is IQ4_NL; strata reads F32, F16, BF16, Q8_0, "
                    "Q4_0 and the K-quants Q2_K to Q6_K"),
    ("arch", IDS, "architecture 'qwen2'; strata reads llama GGUF files"),
    ("layers", IDS, "four.gguf has no tensor blk.3.attn_q.weight (shape [64, 64])"),
    ("cut", IDS, "cut.gguf is truncated: tensor blk.2.ffn_down.weight needs 8704 bytes at "
                 "offset"),
    ("text", IDS, "is a file but not a GGUF file"),
    ("tokenizer", ["--prompt", "hi"], "this file's tokenizer ('xxxxx') is not supported yet, so "
                                      "--prompt TEXT cannot be encoded: give --prompt-ids"),
    ("q8", [*IDS, "--quant", "q3_k"], "unknown quantization 'q3_k'"),
    ("q8", [*IDS, "--quant", "q4_0"], "quantized already"),
])
def test_bad_input_is_one_sentence(which, args, says, files, bad_files, capsys):
    bad_files["text"].write_text("{}")
    path = files["q8_0"] if which == "q8" else bad_files[which]
    rc = main(["generate", str(path), *args])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and says in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_bytes_are_ggufs_layout(kind):
    """quant/kquants.py writes what gguf.quants.dequantize reads back within a quantization
    step (a misplaced scale, nibble or high bit would be off by the weights' whole range)."""
    from strata.quant.kquants import BYTES, ROWS
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((5, 768)) * rng.uniform(0.01, 1, (5, 1))).astype(np.float32)
    w[1, :256] = 0                                        # an all-zero super-block
    w[2, 256:512] += 0.5                                  # one that is all positive
    blocks = ROWS[kind.lower()](torch.from_numpy(w)).numpy()
    assert blocks.shape == (5, 3 * BYTES[kind]) and blocks.dtype == np.uint8
    back = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind])
    sub = w.reshape(5, -1, 16 if kind == "Q6_K" else 32)
    step = (np.ptp(np.concatenate([sub, np.zeros_like(sub[..., :1])], -1), -1) /
            {"Q4_K": 15, "Q5_K": 31, "Q6_K": 63}[kind])
    err = np.abs(back - w).reshape(sub.shape).max(-1)
    assert np.all(err <= step + 1e-6), (err / np.maximum(step, 1e-9)).max()
    assert np.all(back[1, :256] == 0)


@pytest.mark.parametrize("mix", ["q4_k_m", "q5_k_m"])
def test_a_k_mix_file_loads_and_generates(mix, tmp_path, capsys):
    """llama.cpp's usual downloads: Q4_K (Q5_K_M: Q5_K) tensors, Q6_K for output.weight and
    ffn_down, F32 norms; the linears held as QuantLinear parts whose dequantization is bit-exact
    with the gguf package's, the embedding dequantized; then generated from as eager does."""
    ref = hf_model("llama", seed=6, vocab_size=128, num_hidden_layers=2, hidden_size=256,
                   intermediate_size=512)
    path = write_gguf(ref, tmp_path / f"tiny-{mix}.gguf", mix)
    by_name = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert by_name["output.weight"].tensor_type.name == "Q6_K"
    assert by_name["blk.1.ffn_down.weight"].tensor_type.name == "Q6_K"
    assert by_name["blk.1.attn_q.weight"].tensor_type.name == mix[:4].upper()
    built = build(str(path), dtype="fp32", materialise=True)
    assert "dequantized to float32 at load" not in built.weights, built.weights
    heads, kv_heads = ref.config.num_attention_heads, ref.config.num_key_value_heads
    modules = dict(built.model.named_modules())
    for gname in ("blk.1.attn_q.weight", "blk.0.attn_k.weight", "blk.1.ffn_down.weight",
                  "output.weight", "token_embd.weight"):
        t = by_name[gname]
        want = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type))
        if "attn_q" in gname or "attn_k" in gname:
            want = rope_rows(want, heads if "attn_q" in gname else kv_heads, to_gguf=False)
        name = next(n for n, m in modules.items() if isinstance(m, (QuantLinear, torch.nn.Embedding))
                    and gguf_name(n + ".weight") == gname)
        layer = modules[name]
        if gname == "token_embd.weight":
            assert torch.equal(layer.weight.detach(), want)
        else:
            assert isinstance(layer, QuantLinear) and layer.fmt == t.tensor_type.name.lower()
            assert torch.equal(layer.weight(torch.float32), want), gname
    assert build(str(path)).dtype == "bf16"               # K-quants: bf16 activations by default
    rc = main(["generate", str(path), "--prompt-ids", "1,5,9,77,3", "--max-new-tokens", "5",
               "--dtype", "fp32", "--device", DEVICE, "--compare"])
    out = capsys.readouterr().out
    assert rc == 0 and "ids agree with hf eager (cpu): yes" in out, out

