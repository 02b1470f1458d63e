"""The process-replay corpus: programs whose emitted CUDA and C must not change unless a commit means
it to. Each entry is (id, fn, input shapes and dtypes, target, knobs); the README's snippets, the
elementwise/reduction/layout spine, the contraction family on every instruction path, attention
and a Llama decoder layer on sm_80, sm_90, sm_90a, (C) cpu-spr, cpu-avx2; DSL examples in 5 languages.

Why: a refactor of the schedule or the lowering (issue 12's Target, typed Tile IR) must leave
the output byte for byte the same; `python -m tests.replay.record` rewrites baseline.json when a
change to the output is intended (say so in the commit)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

ARCHS = ("sm_80", "sm_90", "sm_90a")
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

README = [
    "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))",
    "torch.relu(torch.matmul(torch.randn(16,64) + torch.randn(64), torch.randn(64,16)))",
    "torch.softmax(torch.randn(4, 1000), dim=-1)",
    "torch.relu(torch.randn(4))",
    "torch.matmul(torch.randn(4096,4096, dtype=torch.bfloat16), torch.randn(4096,4096, dtype=torch.bfloat16))",
]

SPINE = {
    "gelu": (F.gelu, [((7, 33), F32)]),
    "silu_bf16": (F.silu, [((5, 1, 17), BF16)]),
    "add_bcast": (lambda a, b: a + b * 2.5, [((7, 33), F32), ((33,), F32)]),
    "where": (lambda a, b: torch.where(a > b, a, b), [((3, 1, 5), F32), ((3, 1, 5), F32)]),
    "sum_all": (lambda x: x.sum(), [((1009,), F32)]),
    "mean_dim": (lambda x: x.mean(1), [((7, 33, 5), F32)]),
    "argmax": (lambda x: x.argmax(-1), [((9, 1000), F32)]),
    "var": (lambda x: x.var(-1), [((4, 257), F32)]),
    "softmax_f16": (lambda x: x.softmax(-1), [((3, 32000), F16)]),
    "log_softmax": (lambda x: x.log_softmax(0), [((37, 11), F32)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (96,), w, b), [((5, 96), F32), ((96,), F32), ((96,), F32)]),
    "rms_residual": (lambda x, r, w: (x + r, F.rms_norm(x + r, (64,), w)), [((6, 64), BF16)] * 2 + [((64,), BF16)]),
    "big_sum": (lambda x: x.sum(), [((1 << 20,), F32)]),
    "cumsum": (lambda x: x.cumsum(-1), [((3, 17), F32)]),
    "cat_flip": (lambda a, b: torch.cat([a, b.flip(0)], 1), [((4, 5), F32), ((4, 3), F32)]),
    "permute_copy": (lambda x: x.permute(2, 0, 1).contiguous() * 2, [((3, 5, 7), F32)]),
    "embedding": (lambda w, i: F.embedding(i, w), [((100, 16), F32), ((2, 5), torch.int64)]),
    "gather": (lambda x, i: x.gather(1, i), [((4, 9), F32), ((4, 3), torch.int64)]),
    "to_int": (lambda x: (x * 10).to(torch.int32), [((7, 33), F32)]),
    "f64_exp": (lambda x: torch.exp(x) + x.tanh(), [((7, 33), torch.float64)]),
}

MATMUL = {
    f"{name}_{str(dt).split('.')[1]}": (fn, [(s, dt) for s in shapes])
    for dt in (F32, F16, BF16)
    for name, (fn, shapes) in {
        "mm": (torch.mm, [(33, 257), (257, 7)]),
        "mm_128": (torch.mm, [(128, 256), (256, 128)]),
        "linear_decode": (lambda x, w, b: F.linear(x, w, b), [(1, 512), (256, 512), (256,)]),
        "bmm": (torch.bmm, [(3, 17, 33), (3, 33, 9)]),
        "relu_addmm": (lambda b, x, w: torch.relu(torch.addmm(b, x, w)), [(64,), (64, 96), (96, 64)]),
        "rms_linear": (lambda x, w, g: F.linear(F.rms_norm(x, (128,), g), w),
                       [(64, 128), (256, 128), (128,)]),
        "silu_up": (lambda x, g, u: F.silu(x @ g) * (x @ u), [(64, 64), (64, 128), (64, 128)]),
    }.items()
}

ATTENTION = {
    f"sdpa_causal_{str(dt).split('.')[1]}": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [((1, 4, 64, 64), dt)] * 3) for dt in (F32, F16)
} | {
    "sdpa_gqa_decode_bf16": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        [((1, 8, 1, 64), BF16), ((1, 2, 256, 64), BF16), ((1, 2, 256, 64), BF16)]),
    "explicit_softmax_attention": (
        lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1) @ v,
        [((2, 16, 32), F32)] * 3),
}

KNOBBED = [
    ("rms_block128_vec1", "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))", {"BLOCK": "128", "VEC": "1"}),
    ("mm_pad_2stages", "torch.randn(64,64,dtype=torch.float16) @ torch.randn(64,64,dtype=torch.float16)",
     {"SWIZZLE": "pad", "STAGES": "2"}),
    ("mm_fma", "torch.randn(64,64,dtype=torch.bfloat16) @ torch.randn(64,64,dtype=torch.bfloat16)",
     {"INSTR": "fma"}),
    ("sum_chunks", "torch.randn(1 << 16).sum()", {"CHUNKS": "16"}),
]


CPUS = ("cpu-spr", "cpu-avx2")     # C: AVX-512 with bf16 dots and AMX, and AVX2 only
DSL_LANGUAGES = ("cuda", "c", "opencl", "hip", "metal")


def _inputs(specs):
    torch.manual_seed(0)
    out = []
    for shape, dt in specs:
        if dt == torch.int64:
            out.append(torch.randint(0, 3, shape))
        else:
            out.append(torch.randn(shape).to(dt))
    return tuple(out)


def cases():
    """id -> a zero-argument function returning the emitted CUDA text."""
    import strata
    from strata.api import compile_snippet
    from strata.core.context import Context
    out = {}
    for arch in ARCHS:
        for i, code in enumerate(README):
            out[f"readme{i}@{arch}"] = (lambda c=code, a=arch: compile_snippet(c, Context(target=a))[0].source())
        for name, (fn, specs) in {**SPINE, **MATMUL, **ATTENTION}.items():
            out[f"{name}@{arch}"] = (lambda f=fn, s=specs, a=arch: strata.compile(
                f, _inputs(s), ctx=Context(target=a)).source())
        for name, code, knobs in KNOBBED:
            out[f"{name}@{arch}"] = (lambda c=code, k=knobs, a=arch: compile_snippet(
                c, Context(target=a, knobs=dict(k)))[0].source())
    for arch in CPUS:
        for i, code in enumerate(README):
            out[f"readme{i}@{arch}"] = (lambda c=code, a=arch: compile_snippet(c, Context(target=a))[0].source())
        for name, (fn, specs) in {**SPINE, **MATMUL, **ATTENTION}.items():
            out[f"{name}@{arch}"] = (lambda f=fn, s=specs, a=arch: strata.compile(
                f, _inputs(s), ctx=Context(target=a)).source())
    for path in _dsl_examples():
        for lang in DSL_LANGUAGES:
            out[f"dsl_{path.stem}@{lang}"] = lambda p=path, g=lang: _dsl_sources(p, g)
    out["llama_layer_bf16@sm_90a"] = lambda: _llama_layer("sm_90a")
    out["llama_layer_bf16@sm_80"] = lambda: _llama_layer("sm_80")
    return out


def _llama_layer(arch: str) -> str:
    from strata.api import compile_model
    from strata.core.context import Context
    program, _ = compile_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0", layer=0, seq_len=64,
                               dtype="bf16", ctx=Context(target=arch))
    return program.source()


def _dsl_examples():
    import pathlib
    return sorted((pathlib.Path(__file__).parents[2] / "examples" / "kernels").glob("*.py"))


def _dsl_sources(path, language: str) -> str:
    """Every @strata.kernel of a DSL example, specialised by one run on the simulator, in one
    of the five languages a hand-written kernel is emitted in."""
    import importlib.util
    import pathlib
    spec = importlib.util.spec_from_file_location(f"replay_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.run("sim")
    kernels = [v for v in vars(module).values() if type(v).__name__ == "KernelFunction" and v.last]
    root = str(pathlib.Path(__file__).resolve().parents[2])      # provenance names the file:
    return "\n".join(k.source(language) for k in kernels).replace(root, "<repo>")   # any checkout
