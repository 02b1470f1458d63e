"""The model zoo: tiny random models of many transformers architectures (built from their config
classes, no download) and plain PyTorch modules, each a module returning one tensor plus its
example inputs. tests/models/test_zoo.py checks every one against eager;
`python -m tests.models.zoo` prints which compile and match (the list in docs/models.md)."""
from __future__ import annotations

import sys
import time

import torch
from torch import nn

SEQ = 8
VOCAB = 128
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
BASE = dict(IDS, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, head_dim=8)
ENCODER = dict(IDS, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=64)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              image_size=32, patch_size=8, num_channels=3)
GPT2ISH = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)

# name -> (kind, config class name, config kwargs); kind picks the head and the inputs
ARCHS: dict[str, tuple[str, str, dict]] = {
    # decoders (causal LM logits over SEQ token ids)
    "llama": ("causal", "LlamaConfig", BASE),
    "mistral": ("causal", "MistralConfig", BASE),
    "qwen2": ("causal", "Qwen2Config", BASE),
    "qwen3": ("causal", "Qwen3Config", BASE),
    "gemma": ("causal", "GemmaConfig", BASE),
    "gemma2": ("causal", "Gemma2Config", BASE),
    "gemma3": ("causal", "Gemma3TextConfig", BASE),
    "phi": ("causal", "PhiConfig", BASE),
    "phi3": ("causal", "Phi3Config", BASE),
    "stablelm": ("causal", "StableLmConfig", BASE),
    "starcoder2": ("causal", "Starcoder2Config", BASE),
    "olmo": ("causal", "OlmoConfig", BASE),
    "olmo2": ("causal", "Olmo2Config", BASE),
    "cohere": ("causal", "CohereConfig", BASE),
    "granite": ("causal", "GraniteConfig", BASE),
    "smollm3": ("causal", "SmolLM3Config", BASE),
    "helium": ("causal", "HeliumConfig", BASE),
    "glm": ("causal", "GlmConfig", BASE),
    "nemotron": ("causal", "NemotronConfig", BASE),
    "exaone4": ("causal", "Exaone4Config", BASE),
    "falcon": ("causal", "FalconConfig", dict({k: v for k, v in BASE.items() if k != "head_dim"},
                                              num_kv_heads=2, new_decoder_architecture=True)),
    "gpt_neox": ("causal", "GPTNeoXConfig", BASE),
    "persimmon": ("causal", "PersimmonConfig", BASE),
    "opt": ("causal", "OPTConfig", dict(BASE, ffn_dim=64, word_embed_proj_dim=32)),
    "bloom": ("causal", "BloomConfig", dict(BASE, n_head=4, n_layer=2)),
    "gpt2": ("causal", "GPT2Config", GPT2ISH),
    "gpt_bigcode": ("causal", "GPTBigCodeConfig", GPT2ISH),
    "gptj": ("causal", "GPTJConfig", dict(GPT2ISH, rotary_dim=4)),
    "codegen": ("causal", "CodeGenConfig", dict(GPT2ISH, rotary_dim=4)),
    "gpt_neo": ("causal", "GPTNeoConfig", dict(BASE, attention_types=[[["global", "local"], 1]],
                                               window_size=4)),
    # mixture of experts
    "mixtral": ("causal", "MixtralConfig", dict(BASE, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("causal", "Qwen2MoeConfig", dict(BASE, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=16,
                                                   shared_expert_intermediate_size=32)),
    "qwen3_moe": ("causal", "Qwen3MoeConfig", dict(BASE, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=16)),
    "olmoe": ("causal", "OlmoeConfig", dict(BASE, num_experts=4, num_experts_per_tok=2)),
    # encoders (last hidden state)
    "bert": ("encoder", "BertConfig", ENCODER),
    "roberta": ("encoder", "RobertaConfig", ENCODER),
    "xlm_roberta": ("encoder", "XLMRobertaConfig", ENCODER),
    "electra": ("encoder", "ElectraConfig", dict(ENCODER, embedding_size=32)),
    "albert": ("encoder", "AlbertConfig", dict(ENCODER, embedding_size=16)),
    "distilbert": ("encoder", "DistilBertConfig", dict(vocab_size=VOCAB, dim=32, n_layers=2,
                                                       n_heads=4, hidden_dim=64)),
    "mpnet": ("encoder", "MPNetConfig", ENCODER),
    "deberta_v2": ("encoder", "DebertaV2Config", ENCODER),
    "modernbert": ("encoder", "ModernBertConfig", dict(ENCODER, global_attn_every_n_layers=1,
                                                       cls_token_id=1, sep_token_id=2)),
    # vision (pixel values 1 x 3 x 32 x 32)
    "vit": ("vision", "ViTConfig", VISION),
    "deit": ("vision", "DeiTConfig", VISION),
    "dinov2": ("vision", "Dinov2Config", VISION),
    "clip_vision": ("vision", "CLIPVisionConfig", VISION),
    "siglip_vision": ("vision", "SiglipVisionConfig", VISION),
    "convnext": ("vision", "ConvNextConfig", dict(num_channels=3, hidden_sizes=[8, 16],
                                                  depths=[1, 1], num_stages=2, image_size=32)),
    "resnet": ("vision", "ResNetConfig", dict(num_channels=3, embedding_size=8,
                                              hidden_sizes=[8, 16], depths=[1, 1])),
    "mobilenet_v2": ("vision", "MobileNetV2Config", dict(num_channels=3, image_size=32,
                                                         depth_multiplier=0.25)),
    # audio
    "whisper_encoder": ("whisper", "WhisperConfig", dict(IDS, vocab_size=VOCAB, d_model=32,
                                                         decoder_start_token_id=1,
                                                         encoder_layers=2, decoder_layers=1,
                                                         encoder_attention_heads=4,
                                                         decoder_attention_heads=4,
                                                         encoder_ffn_dim=64, decoder_ffn_dim=64,
                                                         num_mel_bins=8, max_source_positions=16)),
    "wav2vec2": ("audio", "Wav2Vec2Config", dict(hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, intermediate_size=64,
                                                 conv_dim=(16, 16), conv_stride=(5, 2),
                                                 conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                                 num_conv_pos_embedding_groups=4)),
}


class _Out(nn.Module):
    """A transformers model as a module returning one tensor (logits or last hidden state)."""

    def __init__(self, model, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, *args):
        out = self.model(*args)
        return getattr(out, self.field) if not isinstance(out, torch.Tensor) else out


class _WhisperEncoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, features):
        return self.encoder(features).last_hidden_state


# The entries whose layers are not all of one kind keep the two layers the configs above give
# (gemma2: sliding then full attention; gpt_neo: global then local); every other entry is built
# with one layer, whose ops are those of all of its layers (test_zoo.py checks that the two-layer
# config has no second kind of layer), at half the compile and simulation time.
MIXED_LAYERS = {"gemma2", "gpt_neo"}
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "encoder_layers")


def config_kwargs(name: str, layers: int | None = None) -> dict:
    """The config fields of one entry, with `layers` layers (default: one, or two for the entries
    in MIXED_LAYERS)."""
    kw = ARCHS[name][2]
    n = layers or (2 if name in MIXED_LAYERS else 1)
    return {**kw, **{k: n for k in LAYER_COUNTS if k in kw}}


def layer_kinds(name: str, layers: int = 2) -> list:
    """Each layer's kind as the config tells it (attention type, rope or not, MoE or dense)."""
    import transformers
    cfg = getattr(transformers, ARCHS[name][1])(**config_kwargs(name, layers))
    fields = ("layer_types", "attention_layers", "no_rope_layers")
    per_layer = [list(getattr(cfg, f)) for f in fields if getattr(cfg, f, None) is not None]
    sparse = [i for i in range(layers) if i in (getattr(cfg, "mlp_only_layers", None) or []) or
              (i + 1) % (getattr(cfg, "decoder_sparse_step", None) or 1)]
    return [tuple(p[i] for p in per_layer) + (i in sparse,) for i in range(layers)]


def build(name: str, seed: int = 0):
    """(module, example inputs) for one zoo entry."""
    import transformers
    kind, cfg_name, _ = ARCHS[name]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_name)(**config_kwargs(name))
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"      # the reference loop (grouped_mm wants bf16 here)
    if kind == "causal":
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        return _Out(model, "logits"), (torch.randint(0, VOCAB, (1, SEQ)),)
    if kind == "encoder":
        model = transformers.AutoModel.from_config(cfg).eval()
        return _Out(model, "last_hidden_state"), (torch.randint(0, VOCAB, (1, SEQ)),)
    if kind == "vision":
        model = transformers.AutoModel.from_config(cfg).eval()
        field = "last_hidden_state" if hasattr(cfg, "patch_size") else "pooler_output"
        return _Out(model, field), (torch.randn(1, 3, 32, 32),)
    if kind == "whisper":
        model = transformers.WhisperModel(cfg).eval()
        return _WhisperEncoder(model), (torch.randn(1, 8, 32),)
    model = transformers.AutoModel.from_config(cfg).eval()
    return _Out(model, "last_hidden_state"), (torch.randn(1, 400),)


# plain PyTorch modules
def _plain():
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, stride=2), nn.BatchNorm2d(16),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    for m in cnn.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    return {
        "mlp": (nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)), (torch.randn(5, 16),)),
        "cnn": (cnn, (torch.randn(2, 3, 16, 16),)),
        "transformer_layer": (nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
                              (torch.randn(2, 7, 32),)),
        "multihead_attention": (_MHA(), (torch.randn(2, 5, 16),)),
        "groupnorm": (nn.GroupNorm(4, 8), (torch.randn(2, 8, 5, 5),)),
        "unet_up": (_Up(), (torch.randn(1, 4, 6, 6),)),
    }


class _MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class _Up(nn.Module):
    """Upsample + conv, as a decoder stage of a U-Net or a VAE."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)

    def forward(self, x):
        return torch.nn.functional.silu(self.norm(self.conv(
            torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest"))))


PLAIN = ("mlp", "cnn", "transformer_layer", "multihead_attention", "groupnorm", "unet_up")


def build_any(name: str):
    if name in PLAIN:
        module, inputs = _plain()[name]
        return module.eval(), inputs
    return build(name)


def main(argv) -> int:
    """Try every entry on the simulator; print one line each (what docs/models.md lists)."""
    sys.path.insert(0, "tests")
    from conftest import run_and_compare
    names = argv or [*ARCHS, *PLAIN]
    ok = 0
    for name in names:
        t = time.perf_counter()
        try:
            module, inputs = build_any(name)
            run_and_compare(module, inputs, contraction=True, native=False)
            verdict = "PASS"
            ok += 1
        except Exception as e:                      # noqa: BLE001 - a report, not a test
            verdict = f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
        print(f"{name:20s} {time.perf_counter() - t:6.1f} s  {verdict}", flush=True)
    print(f"{ok} of {len(names)} pass")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
