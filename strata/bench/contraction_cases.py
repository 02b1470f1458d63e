"""The cases of `python -m strata.bench.contractions` (issues 3 and 54's GPU goals), as pure data.

Why from the bundled configs: the decode-shape goal is about the projections of real Llama/Qwen
layers, so (K, N) are read from strata/models/configs (hidden, heads, KV heads, head dim,
intermediate size, QKV bias) rather than typed in. Projections with the same (K, N, bias) are one
case, labelled with every layer that has it. Building a case (its module and inputs) needs torch
on the requested device; listing them needs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core import dtypes
from ..models.source import resolve
from .harness import time_cuda

# (bundled model name, short label): the layers whose decode shapes the goal names
DECODE_MODELS = (("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "TinyLlama-1.1B"),
                 ("meta-llama/Llama-3.2-1B", "Llama-3.2-1B"),
                 ("Qwen/Qwen2.5-7B", "Qwen2.5-7B"))
DECODE_M = (1, 16)
MM_SIZE = 4096
MM_SIZES = (4096, 8192)
# the layers whose prefill products (with the epilogue each layer fuses) issue 54 names
PREFILL_MODELS = (("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "TinyLlama-1.1B"),
                  ("meta-llama/Meta-Llama-3-8B", "Llama-3-8B"))
PREFILL_M = (128, 512, 2048)
ATTENTION_SEQ = 2048
ATTENTION_SEQS = (512, 2048, 8192, 16384)
LONG_HEADS = 8          # seq >= 8192: 8 heads (eager's float64 check holds every score)
# head dim -> the model whose query-head count the attention case takes
ATTENTION_MODELS = ((64, "TinyLlama/TinyLlama-1.1B-Chat-v1.0"), (128, "Qwen/Qwen2.5-7B"))

GOAL_MM = 0.9           # issue 3: >= 0.9x cuBLAS at 4096^3
GOAL_DECODE = 1.0       # >= 1.0x cuBLAS at decode shapes (M <= 16)
GOAL_PREFILL = 0.9      # issue 54: >= 0.9x cuBLAS at the prefill shapes, epilogues on both sides
GOAL_ATTENTION = 1.0    # issue 54: >= 1.0x the fastest torch SDPA backend
GOAL_FP8 = 0.9          # issue 54: FP8 matmul 4096^3 >= 0.9x torch._scaled_mm


@dataclass(frozen=True)
class Projection:
    label: str          # "TinyLlama-1.1B q_proj/o_proj"
    k: int
    n: int
    bias: bool


def projections(cfg: dict, short: str) -> list[Projection]:
    """The linear layers of one decoder layer of a config.json, same-shaped ones merged."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or h // heads
    qwen = cfg.get("model_type") == "qwen2"
    qkv_bias = qwen or bool(cfg.get("attention_bias", False))
    o_bias = not qwen and bool(cfg.get("attention_bias", False))
    mlp_bias = bool(cfg.get("mlp_bias", False))
    layers = [("q_proj", h, heads * hd, qkv_bias), ("k_proj", h, kv * hd, qkv_bias),
              ("v_proj", h, kv * hd, qkv_bias), ("o_proj", heads * hd, h, o_bias),
              ("gate_proj", h, cfg["intermediate_size"], mlp_bias),
              ("up_proj", h, cfg["intermediate_size"], mlp_bias),
              ("down_proj", cfg["intermediate_size"], h, mlp_bias)]
    merged: dict[tuple, list[str]] = {}
    for name, k, n, bias in layers:
        merged.setdefault((k, n, bias), []).append(name)
    return [Projection(f"{short} {'/'.join(names)}", k, n, bias)
            for (k, n, bias), names in merged.items()]


def decode_projections(configs: dict[str, dict] | None = None) -> list[Projection]:
    """Projections of every DECODE_MODELS layer, one per (K, N, bias), labels joined."""
    configs = configs if configs is not None else _bundled(n for n, _ in DECODE_MODELS)
    by_shape: dict[tuple, list[str]] = {}
    for name, short in DECODE_MODELS:
        for p in projections(configs[name], short):
            by_shape.setdefault((p.k, p.n, p.bias), []).append(p.label)
    return [Projection(", ".join(labels), k, n, bias) for (k, n, bias), labels in by_shape.items()]


def _bundled(names) -> dict[str, dict]:
    return {n: resolve(n).config for n in names}


@dataclass(frozen=True)
class MatmulCase:
    """torch.mm(a, b) (linear=False) or F.linear(x, W, b) of an nn.Linear (linear=True)."""
    m: int
    k: int
    n: int
    linear: bool = False
    bias: bool = False
    label: str = ""
    dtype: str = "bf16"

    @property
    def name(self) -> str:
        op = "linear" if self.linear else "mm"
        return f"{op} {self.m}×{self.k}×{self.n}" + (" +bias" if self.bias else "")

    @property
    def group(self) -> str:
        return "decode matmul" if self.m <= 16 else "matmul"

    @property
    def goal(self) -> float:
        return GOAL_DECODE if self.m <= 16 else GOAL_MM

    @property
    def reference(self) -> str:
        return "torch (cuBLAS)"

    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    def build(self, device: str = "cuda"):
        """(module, inputs, timed module): the module is what strata compiles and accuracy
        checks; the timed one is what torch runs (the same here)."""
        dt = _torch_dtype(self.dtype)
        gen = torch.Generator(device=device).manual_seed(0) if device != "meta" else None
        if self.linear:
            torch.manual_seed(0)
            module = nn.Linear(self.k, self.n, bias=self.bias, device=device, dtype=dt).eval()
            inputs = (_randn((self.m, self.k), dt, device, gen),)
        else:
            module = Mm()
            inputs = (_randn((self.m, self.k), dt, device, gen), _randn((self.k, self.n), dt, device, gen))
        return module, inputs, module


@dataclass(frozen=True)
class ScaledMmCase:
    """torch._scaled_mm of e4m3 a (M, K) and b (N, K) read as b.t(), a scale per row of a and per
    column of b, bf16 out: the FP8 product FP8Linear runs (cuBLASLt's rowwise FP8 on a GPU)."""
    m: int
    k: int
    n: int
    label: str = ""
    dtype: str = "f8e4m3"

    @property
    def name(self) -> str:
        return f"fp8 scaled_mm {self.m}×{self.k}×{self.n}"

    group = "fp8 matmul"
    goal = GOAL_FP8
    reference = "torch._scaled_mm"

    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    def build(self, device: str = "cuda"):
        gen = torch.Generator(device=device).manual_seed(0) if device != "meta" else None
        e4m3 = _torch_dtype(self.dtype)
        inputs = (_randn((self.m, self.k), e4m3, device, gen),
                  _randn((self.n, self.k), e4m3, device, gen),
                  _rand((self.m, 1), device, gen), _rand((1, self.n), device, gen))
        return ScaledMm(), inputs, ScaledMm()


EPILOGUES = {"none": "", "residual": " + residual", "silu_gate": " SiLU(gate)·up"}


@dataclass(frozen=True)
class PrefillCase:
    """One decoder layer's product at a prefill of M tokens with the epilogue the layer fuses:
    "none" (q_proj), "residual" (o_proj, down_proj: x W^T + r), "silu_gate" (SiLU(x Wg^T) *
    (x Wu^T), N columns each); torch runs the same module eagerly (cuBLAS and its epilogue)."""
    m: int
    k: int
    n: int
    epilogue: str = "none"
    label: str = ""
    dtype: str = "bf16"
    group = "prefill matmul"
    goal = GOAL_PREFILL
    reference = "torch (cuBLAS)"

    @property
    def name(self) -> str:
        return f"prefill {self.m}×{self.k}×{self.n}{EPILOGUES[self.epilogue]}"

    def flops(self) -> int:
        return 2 * self.m * self.k * self.n * (2 if self.epilogue == "silu_gate" else 1)

    def build(self, device: str = "cuda"):
        dt = _torch_dtype(self.dtype)
        gen = torch.Generator(device=device).manual_seed(0) if device != "meta" else None
        torch.manual_seed(0)
        linear = lambda: nn.Linear(self.k, self.n, bias=False, device=device, dtype=dt)  # noqa: E731
        x = _randn((self.m, self.k), dt, device, gen)
        if self.epilogue == "silu_gate":
            module, inputs = GatedUp(linear(), linear()), (x,)
        elif self.epilogue == "residual":
            module, inputs = Residual(linear()), (x, _randn((self.m, self.n), dt, device, gen))
        else:
            module, inputs = linear(), (x,)
        return module.eval(), inputs, module


def prefill_cases(configs: dict[str, dict] | None = None, models=PREFILL_MODELS,
                  ms=PREFILL_M) -> list[PrefillCase]:
    """q_proj, o_proj + residual, gate/up + SiLU, down_proj + residual of each model at each M."""
    configs = configs if configs is not None else _bundled(n for n, _ in models)
    out = []
    for name, short in models:
        cfg = configs[name]
        h, inter = cfg["hidden_size"], cfg["intermediate_size"]
        q = cfg["num_attention_heads"] * (cfg.get("head_dim") or h // cfg["num_attention_heads"])
        for m in ms:
            out += [PrefillCase(m, h, q, "none", f"{short} q_proj"),
                    PrefillCase(m, q, h, "residual", f"{short} o_proj"),
                    PrefillCase(m, h, inter, "silu_gate", f"{short} gate/up_proj"),
                    PrefillCase(m, inter, h, "residual", f"{short} down_proj")]
    return out


@dataclass(frozen=True)
class AttentionCase:
    """scaled_dot_product_attention (causal or not), q, k and v of shape (batch, heads, seq,
    head_dim), against whichever of torch's SDPA backends runs it fastest on this GPU."""
    heads: int
    seq: int
    head_dim: int
    batch: int = 1
    label: str = ""
    dtype: str = "bf16"
    knobs: tuple = ()       # (NAME, value) pins strata compiles the case with
    causal: bool = True

    @property
    def name(self) -> str:
        pins = "".join(f", {k}={v}" for k, v in self.knobs)
        kind = "causal attention" if self.causal else "attention"
        return f"{kind} {self.batch}×{self.heads}×{self.seq}×{self.head_dim}" + \
            (f" ({pins[2:]})" if pins else "")

    @property
    def group(self) -> str:
        return "attention"

    @property
    def goal(self) -> float:
        return GOAL_ATTENTION

    @property
    def reference(self) -> str:
        return "the fastest torch SDPA"

    def flops(self) -> int:
        return attention_flops(self.batch, self.heads, self.seq, self.seq, self.head_dim,
                               causal=self.causal)

    def build(self, device: str = "cuda"):
        dt = _torch_dtype(self.dtype)
        gen = torch.Generator(device=device).manual_seed(0) if device != "meta" else None
        shape = (self.batch, self.heads, self.seq, self.head_dim)
        inputs = tuple(_randn(shape, dt, device, gen) for _ in range(3))
        return SDPA(self.causal), inputs, FastestSDPA(self.causal)


def attention_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                    causal: bool) -> int:
    """Q·Kᵀ and P·V, 2 FLOPs per multiply-add each; causal attention computes half the scores
    (the convention of FlashAttention's benchmarks)."""
    full = 4 * batch * heads * q_len * kv_len * head_dim
    return full // 2 if causal else full


class Mm(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)


class ScaledMm(nn.Module):
    def forward(self, a, b, sa, sb):
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


class Residual(nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, x, r):
        return self.linear(x) + r


class GatedUp(nn.Module):
    def __init__(self, gate, up):
        super().__init__()
        self.gate, self.up = gate, up

    def forward(self, x):
        return F.silu(self.gate(x)) * self.up(x)


class SDPA(nn.Module):
    def __init__(self, causal: bool = True):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class FastestSDPA(SDPA):
    """torch's SDPA on the backend that runs these inputs fastest here (flash, cuDNN or
    memory-efficient, each timed at the first call; one that refuses the inputs is skipped);
    `chosen` names it. Off a GPU (tests), torch's own choice."""
    BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")

    def __init__(self, causal: bool = True):
        super().__init__(causal)
        self.chosen: str | None = None

    def forward(self, q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if self.chosen is None:
            self.chosen = self._fastest(q, k, v) if q.is_cuda else ""
        if not self.chosen:
            return super().forward(q, k, v)
        with sdpa_kernel(getattr(SDPBackend, self.chosen)):
            return super().forward(q, k, v)

    def _fastest(self, q, k, v) -> str:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        plain = super().forward
        best = (float("inf"), "")
        for name in self.BACKENDS:
            try:
                with sdpa_kernel(getattr(SDPBackend, name)):
                    ms = time_cuda(plain, [(q, k, v)], warmup_ms=2, rep_ms=10, min_runs=5).median_ms
                best = min(best, (ms, name))
            except RuntimeError:          # this backend does not take these inputs here
                continue
        return best[1]


def _torch_dtype(dtype: str) -> torch.dtype:
    return dtypes.to_torch(dtype)


def _randn(shape, dtype, device, gen):
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def _rand(shape, device, gen):
    if device == "meta":
        return torch.empty(shape, device="meta")
    return torch.rand(shape, generator=gen, device=device) + 0.5


# attention schedules a GPU run weighs (`--sweep`): (INSTR, BLOCK_M, BLOCK_N); None: the default
ATTENTION_SWEEP = (("mma", None, None), ("mma", 128, None), ("mma", None, 32),
                   ("wgmma", None, None), ("wgmma", 128, None), ("wgmma", None, 32),
                   ("wgmma", None, 128))


def sweep_cases(configs: dict[str, dict] | None = None) -> list:
    """Causal attention at seq 2048, head dims 64 and 128, under each ATTENTION_SWEEP pin."""
    configs = configs if configs is not None else _bundled(n for _, n in ATTENTION_MODELS)
    out = []
    for hd, model in ATTENTION_MODELS:
        heads = configs[model]["num_attention_heads"]
        for instr, bm, bn in ATTENTION_SWEEP:
            pins = (("INSTR", instr),) + ((("BLOCK_M", bm),) if bm else ()) + \
                ((("BLOCK_N", bn),) if bn else ())
            out.append(AttentionCase(heads, ATTENTION_SEQ, hd, label=model.split("/")[-1] + " heads",
                                     knobs=pins))
    return out


def cases(quick: bool = False, configs: dict[str, dict] | None = None) -> list:
    """Every case in table order: bf16 mm at 4096³ and 8192³, FP8 at 4096³, the decode-shape
    linears (M = 1 and 16), the prefill products of TinyLlama and Llama-3-8B (M = 128, 512, 2048,
    with their epilogues), attention at head dims 64 and 128, causal and not, seq 512 to 16k (and
    at 2048 causal on wgmma too). quick: 4096³ (both), TinyLlama's projections at M = 1 and at a
    512-token prefill, causal attention at 2048 x 64 (and on wgmma)."""
    configs = configs if configs is not None else _bundled(
        {n for n, _ in DECODE_MODELS} | {n for _, n in ATTENTION_MODELS} | {n for n, _ in PREFILL_MODELS})
    out: list = [MatmulCase(s, s, s, label=f"square, {s}³") for s in MM_SIZES[:1 if quick else None]]
    out.append(ScaledMmCase(MM_SIZE, MM_SIZE, MM_SIZE, label="square, 4096³, e4m3 row scales"))
    projs = decode_projections(configs)
    if quick:
        first = DECODE_MODELS[0][1]
        projs = [p for p in projs if p.label.startswith(first)]
    for m in DECODE_M[:1] if quick else DECODE_M:
        out += [MatmulCase(m, p.k, p.n, linear=True, bias=p.bias, label=p.label) for p in projs]
    out += prefill_cases(configs, PREFILL_MODELS[:1], (512,)) if quick else prefill_cases(configs)
    for hd, model in ATTENTION_MODELS[:1] if quick else ATTENTION_MODELS:
        cfg = configs[model]
        heads = cfg["num_attention_heads"]
        got = cfg.get("head_dim") or cfg["hidden_size"] // heads
        if got != hd:
            raise ValueError(f"{model} has head dim {got}, not {hd}")
        short = dict(DECODE_MODELS).get(model, model.split("/")[-1])
        for seq in (ATTENTION_SEQ,) if quick else ATTENTION_SEQS:
            for causal in (True,) if quick else (True, False):
                h = heads if seq < 8192 else LONG_HEADS
                out.append(AttentionCase(h, seq, hd, label=f"{short} heads" if h == heads
                                         else f"{short}'s head dim, {h} heads", causal=causal))
        # Hopper's wgmma form, pinned until a GPU run shows it beats mma.sync (the default)
        out.append(AttentionCase(heads, ATTENTION_SEQ, hd, label=f"{short} heads",
                                 knobs=(("INSTR", "wgmma"),)))
    return out
