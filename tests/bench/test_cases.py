"""The LLM op suite's definitions are valid torch: every case builds and runs (on the meta device
at full size, on the CPU at a tiny seq), GQA maps each query head to its kv head, and the
analytic FLOPs agree with torch's FlopCounterMode."""
import pytest
import torch
import torch.nn.functional as F

from strata.bench import cases as C
from strata.bench.work import count_flops, estimate_work

ALL = C.cases(seqs=(1, 2048))


def _shapes(out):
    flat, _ = torch.utils._pytree.tree_flatten(out)
    return [tuple(t.shape) for t in flat]


def expected_shapes(case):
    m, s = case.model, case.seq
    return {
        "rmsnorm": [(1, s, m.hidden)], "layernorm": [(1, s, m.hidden)],
        "softmax": [(1, m.heads, s, s)],
        "rope": [(1, m.heads, s, m.head_dim), (1, m.kv_heads, s, m.head_dim)],
        "silu_mul": [(1, s, m.intermediate)], "gelu": [(1, s, m.intermediate)],
        "add_rmsnorm": [(1, s, m.hidden)] * 2, "sdpa": [(1, m.heads, s, m.head_dim)],
        "decode_sdpa": [(1, m.heads, 1, m.head_dim)],
        "qkv_proj": [(1, s, m.heads * m.head_dim)] + [(1, s, m.kv_heads * m.head_dim)] * 2,
        "mlp": [(1, s, m.hidden)], "decoder_block": [(1, s, m.hidden)],
    }[case.op]


def test_the_suite_has_every_op_model_seq_and_dtype():
    full = C.cases()
    assert len(full) == len(C.OPS) * 2 * 3 * 2
    assert {c.op for c in full} == set(C.OPS) and {c.seq for c in full} == {1, 128, 2048}
    assert len({c.name for c in full}) == len(full)
    assert C.MODELS["qwen2.5-7b"].heads // C.MODELS["qwen2.5-7b"].kv_heads == 7


def test_every_case_runs_on_meta_at_full_size_with_the_right_flops():
    for case in ALL:
        module, inputs = case.build("meta")
        assert all(x.dtype == module_dtype(module, x) for x in inputs)
        assert _shapes(module(*inputs)) == expected_shapes(case), case.name
        counted = count_flops(module, inputs)
        s, m = case.seq, case.model
        full_attention = 4 * m.heads * m.head_dim * s * s
        causal = C._attn_flops(m, s)
        if case.op in ("sdpa", "decoder_block"):
            assert counted - full_attention + causal == case.flops(), case.name
        else:
            assert counted == case.flops(), case.name


def module_dtype(module, x):
    p = next(iter(module.parameters()), None)
    return x.dtype if p is None else p.dtype


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_tinyllama_cases_run_eagerly_on_cpu(dtype):
    for case in C.cases(models=("tinyllama",), seqs=(3,), dtypes=(dtype,)):
        module, inputs = case.build("cpu")
        with torch.no_grad():
            out = module(*inputs)
        assert _shapes(out) == expected_shapes(case), case.name
        flat, _ = torch.utils._pytree.tree_flatten(out)
        assert all(torch.isfinite(t.float()).all() for t in flat), case.name
        assert not any(p.requires_grad for p in module.parameters())


def test_builds_are_deterministic():
    case = C.cases(models=("tinyllama",), seqs=(2,), dtypes=("f32",), ops=("add_rmsnorm",))[0]
    (m1, x1), (m2, x2) = case.build("cpu"), case.build("cpu")
    assert torch.equal(m1.norm.weight, m2.norm.weight) and torch.equal(x1[0], x2[0])
    assert not torch.equal(m1.norm.weight, torch.ones_like(m1.norm.weight))   # weights are not trivial


def test_gqa_maps_query_head_to_its_kv_head():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 8, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    got = C.CausalSDPA(4)(q, k, v)
    for h in range(8):
        want = F.scaled_dot_product_attention(q[:, h:h + 1], k[:, h // 4:h // 4 + 1],
                                              v[:, h // 4:h // 4 + 1], is_causal=True)
        torch.testing.assert_close(got[:, h:h + 1], want)


def test_rope_rotate_half():
    x = torch.arange(8.0).view(1, 1, 1, 8)
    assert C.rotate_half(x).flatten().tolist() == [-4, -5, -6, -7, 0, 1, 2, 3]
    cos, sin = C.rope_cos_sin(4, 8, 10000.0, torch.float32, "cpu")
    assert cos.shape == (1, 1, 4, 8) and torch.allclose(cos[0, 0, 0], torch.ones(8))
    q, k = C.apply_rope(x, x, cos[..., :1, :], sin[..., :1, :])      # position 0: identity
    assert torch.equal(q, x) and torch.equal(k, x)


def test_work_counts_weights_inputs_and_outputs_once():
    case = C.cases(models=("tinyllama",), seqs=(4,), dtypes=("bf16",), ops=("mlp",))[0]
    module, inputs = case.build("cpu")
    w = estimate_work(module, inputs, flops=case.flops())
    m = case.model
    assert w.bytes == 2 * (3 * m.hidden * m.intermediate + 2 * 4 * m.hidden)
    assert w.flops == 2 * 4 * m.hidden * m.intermediate * 3


def test_parse_list():
    assert C.parse_list("fp32,BF16", ("f32", "bf16"), "dtype", C.DTYPE_ALIASES) == ["f32", "bf16"]
    assert C.parse_list(None, ("a", "b"), "x") == ["a", "b"]
    from strata.core.errors import StrataError
    with pytest.raises(StrataError, match="unknown model 'llama3'"):
        C.parse_list("llama3", tuple(C.MODELS), "model")


@pytest.mark.parametrize("case", C.cases(models=("tinyllama",), seqs=(1, 128),
                                         ops=("sdpa", "decoder_block")), ids=lambda c: c.name)
def test_attention_and_decoder_cases_lower_to_c_for_this_cpu(case):
    """The report's cases at full size compile for the host CPU (a tile pass once failed on the
    bf16 decoder block at seq 1, seen only as `failed` in the suite's report)."""
    import strata
    from strata.core.context import Context
    module, inputs = case.build("cpu")
    program = strata.compile(module, inputs, ctx=Context(target="host"), until="c")
    assert "strata_run" in program.lowered.source
