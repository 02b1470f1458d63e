"""c_qdot: a quantized matrix-vector row's block loop, matched by what it computes and printed as
vector code; run natively and compared with float64 eager at odd shapes, for both formats, bf16
and fp32 activations, with and without a bias, on the host's path (AVX-512 here), the AVX2 path
(cpu-avx2) and the loop as written (cpu: x86-64), and refused for a block loop that is not a
format's dequantization; QDOT=vnni rows (int8 activations: vpdpbusd on a CPU with AVX512-VNNI,
vpmaddubsw on AVX2 without AVX-512) for bf16 activations, f32 rows keeping the float lanes unless
pinned."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from conftest import HAS_CC
from strata.quant.formats import QuantLinear
from strata.core.targets import host
from test_cpu_dot import BF16, assert_matches, cpu_compile, knobs_of

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


def quant_linear(fmt, k, n, bias, dtype):
    torch.manual_seed(k * n)
    layer = QuantLinear.from_linear(torch.nn.Linear(k, n, bias=bias), fmt).eval()
    return layer if dtype == torch.float32 else layer.to(dtype)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("k,n,bias,dtype", [(96, 37, False, BF16), (64, 1, True, BF16),
                                            (352, 5, False, torch.float32),
                                            (224, 13, True, torch.float32)], ids=str)
def test_a_quantized_row_runs_as_vector_blocks(fmt, k, n, bias, dtype):
    layer = quant_linear(fmt, k, n, bias, dtype)
    x = torch.randn(1, k).to(dtype)
    prog, _ = cpu_compile(layer, (x,))
    assert f"{fmt} blocks as vector code" in prog.source("c")
    assert_matches(prog, layer, (x,))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("target", ["cpu-avx2", "cpu"])
def test_the_avx2_path_and_the_loop_as_written(fmt, target):
    layer, x = quant_linear(fmt, 160, 11, True, BF16), torch.randn(1, 160).to(BF16)
    prog, _ = cpu_compile(layer, (x,), target=target)
    assert "vector code" in prog.source("c")       # printed under #if; x86-64 compiles the #else
    assert_matches(prog, layer, (x,))


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("m", [1, 3])
def test_k_not_a_multiple_of_the_block(fmt, m):
    layer = quant_linear(fmt, 100, 7, True, BF16)      # K padded to 128 in the blocks, sliced
    x = torch.randn(m, 100).to(BF16)
    prog, _ = cpu_compile(layer, (x,))                  # (100 is no multiple of 32: whole loops)
    assert_matches(prog, layer, (x,))


def test_an_edge_case_input_row():
    layer = quant_linear("q4_0", 64, 7, False, torch.float32)
    x = torch.tensor([[0.0] * 31 + [1e30] + [-0.0] * 31 + [-3.5]])
    prog, _ = cpu_compile(layer, (x,))
    assert_matches(prog, layer, (x,))


def test_a_block_loop_that_is_no_format_keeps_its_loop():
    def off_by_one(x, q, d):             # nibbles minus 7: not q4_0's minus 8
        w = torch.cat([q & 15, q >> 4], -1).to(torch.float32) - 7
        return F.linear(x, (w * d.to(torch.float32)).flatten(-2))
    x = torch.randn(1, 64)
    q = torch.randint(0, 256, (9, 2, 16), dtype=torch.uint8)
    d = (torch.rand(9, 2, 1) * 0.01).to(torch.float16)
    prog, _ = cpu_compile(off_by_one, (x, q, d))
    assert "vector code" not in prog.source("c")
    assert_matches(prog, off_by_one, (x, q, d))


def test_the_vector_rows_differ_from_the_scalar_loop_only_in_rounding():
    layer, x = quant_linear("q4_0", 2048, 64, False, BF16), torch.randn(1, 2048).to(BF16)
    exact = F.linear(x.double(), layer.weight(torch.float64))
    for target in (None, "cpu-avx2", "cpu"):
        prog, _ = cpu_compile(layer, (x,), target=target)
        err = ((prog(x).double() - exact).abs().max() / exact.abs().max()).item()
        assert err < 8e-3, err                     # bf16 output: one rounding, a few ulps


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("m,k,n,dtype", [(5, 96, 37, BF16), (3, 224, 17, torch.float32)], ids=str)
def test_a_prefill_weight_is_dequantized_as_vector_blocks(fmt, m, k, n, dtype):
    layer, x = quant_linear(fmt, k, n, True, dtype), torch.randn(m, k).to(dtype)
    prog, _ = cpu_compile(layer, (x,))
    source = prog.source("c")
    assert (f"{fmt} blocks stored as vector code" in source) == (dtype == BF16)   # (f32: fused)
    assert_matches(prog, layer, (x,))
    slow, _ = cpu_compile(layer, (x,), target="cpu")         # the loop as written: same bits
    torch.testing.assert_close(prog(x), slow(x), rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("k,n,bias,dtype", [(512, 37, False, BF16), (256, 1, True, BF16),
                                            (768, 13, True, torch.float32)], ids=str)
@pytest.mark.parametrize("target", [None, "cpu-avx2", "cpu"])
def test_k_quant_rows_run_as_vector_blocks(fmt, k, n, bias, dtype, target):
    """Q4_K and Q5_K (w = d * sc * q - dmin * mn, blocks of 32 in super-blocks of 256) and Q6_K
    (blocks of 16): the host's vector code, AVX2's, and the loop as written (x86-64: the #else)."""
    layer, x = quant_linear(fmt, k, n, bias, dtype), torch.randn(1, k).to(dtype)
    prog, log = cpu_compile(layer, (x,), target=target)
    assert f"{fmt} blocks as vector code" in prog.source("c")
    assert f"blocks of {16 if fmt == 'q6_k' else 32}" in log
    assert_matches(prog, layer, (x,))


@pytest.mark.parametrize("fmt", ["q4_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("m,k", [(1, 300), (5, 512)], ids=str)
@pytest.mark.parametrize("target", [None, "cpu-avx2"])
def test_k_quant_prefill_and_a_k_past_the_blocks(fmt, m, k, target):
    """A prefill dequantizes the weight once as vector blocks; K = 300 is padded to 512 in the
    blocks and sliced (no whole blocks in the loop: it runs as written). On AVX2 too: its Q6_K
    blocks once stored 8 of their 16 bf16 weights, the rest left unset."""
    layer, x = quant_linear(fmt, k, 11, True, BF16), torch.randn(m, k).to(BF16)
    prog, _ = cpu_compile(layer, (x,), target=target)
    assert (f"{fmt} blocks stored as vector code" in prog.source("c")) == (m > 1)
    assert_matches(prog, layer, (x,))


def test_a_block_minimum_added_not_taken_is_no_q4_k():
    def plus_min(x, q, sc, mn, d):       # (d * sc) * q + d * mn: not q4_k's minus
        w = (d * sc.float()) * torch.cat([q & 15, q >> 4], -1).float() + d * mn.float()
        return F.linear(x, w.flatten(1))
    x = torch.randn(1, 64)
    q = torch.randint(0, 256, (9, 2, 16), dtype=torch.uint8)
    sc, mn = (torch.randint(0, 64, (9, 2, 1), dtype=torch.uint8) for _ in range(2))
    d = torch.rand(9, 1, 1) * 0.01
    prog, _ = cpu_compile(plus_min, (x, q, sc, mn, d))
    assert "vector code" not in prog.source("c")
    assert_matches(prog, plus_min, (x, q, sc, mn, d))


def test_an_index_split_into_heads_and_joined_again_is_affine():
    import numpy as np
    from strata.core.expr import Var, add, evaluate, floordiv, mod, mul, simplify, to_str
    k = Var("k", "i64")
    joined = add(mul(floordiv(k, 64), 128), mul(mod(k, 64), 2))          # (k // 64 * 64 + k % 64) * 2
    assert to_str(simplify(joined)) == "k * 2"
    other = add(mul(floordiv(k, 64), 32), mod(k, 64))                     # not k: kept as written
    values = np.arange(0, 300)
    assert np.array_equal(evaluate(simplify(other), {"k": values}), values // 64 * 32 + values % 64)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_an_o_projection_of_attention_heads_runs_as_vector_blocks(fmt):
    layer = quant_linear(fmt, 256, 48, False, torch.float32)

    def o_proj(attn, residual):          # (1, 4 heads, 1, 64) joined into 256, projected, added
        return residual + layer(attn.transpose(1, 2).reshape(1, 1, 256))
    inputs = (torch.randn(1, 4, 1, 64), torch.randn(1, 1, 48))
    prog, log = cpu_compile(o_proj, inputs)
    assert "in 8 blocks of 32" in log and f"{fmt} blocks as vector code" in prog.source("c")
    assert_matches(prog, o_proj, inputs)


VNNI = all(host().has(f) for f in ("avx512_vnni", "avx512bw", "avx512vl"))
VNNI_TARGET = replace(host(), name="cpu-vnni", features=host().features | {
    "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c"})


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("k,n", [(96, 37), (1024, 5), (608, 64)], ids=str)    # tail only, 2
def test_vnni_rows_of_bf16_activations_match_eager(fmt, k, n):                # groups, both
    layer = quant_linear(fmt, k, n, True, BF16)
    x = torch.randn(1, k).to(BF16)
    prog, _ = cpu_compile(layer, (x,), target=VNNI_TARGET)
    assert knobs_of(prog, "k_linear_reduce")["QDOT"] == "vnni"
    assert f"st_{fmt}_vnni_bf16((" in prog.source("c") and "= st_quantize_" in prog.source("c")
    assert_matches(prog, layer, (x,))       # bf16's tolerance: int8 activations err ~0.3%


@pytest.mark.parametrize("target", [VNNI_TARGET, "cpu-avx2"], ids=["vnni", "avx2"])
@pytest.mark.parametrize("k,n,dtype", [(512, 37, BF16), (2304, 5, torch.float32), (768, 3, BF16), (576, 7, BF16)],
                         ids=str)                # 2 super-blocks a step, 9 (a tail of 1), 3
def test_k_quant_int8_rows_match_eager(target, k, n, dtype):
    """Q4_K, Q5_K and Q6_K rows on int8 activations: Q4_K's 16 (AVX2: 8) scales and minimums a
    step from the bytes and the two super-block scales (Q5_K's too, two blocks a vpdpbusd), Q6_K's 16 blocks of 16 a step (bf16: a module moved to bf16; f16 as quantized, in an f32
    row with QDOT=vnni pinned)."""
    for fmt in ("q4_k", "q5_k", "q6_k"):
        layer = quant_linear(fmt, k, n, True, dtype)
        x = torch.randn(1, k).to(dtype)
        prog, _ = cpu_compile(layer, (x,), {"QDOT": "vnni"}, target=target)
        scales = "bf16" if layer.d.dtype == BF16 else "f16"
        assert f"st_{fmt}_vnni_{scales}((" in prog.source("c")
        got, want = prog(x).double(), layer(x).double()
        assert ((got - want).norm() / want.norm()).item() < 1.5e-2   # int8 activations: ~0.6%


class _Sliced(torch.nn.Module):
    """A row whose activations start `at` columns into its input: at 32 an odd block, which the
    Q4 rows' nibble-ordered activations (pairs of blocks on AVX2, fours on AVX-512) cannot take."""

    def __init__(self, layer, at):
        super().__init__()
        self.layer, self.at = layer, at

    def forward(self, x):
        return self.layer(x[:, self.at:])


@pytest.mark.parametrize("target", [VNNI_TARGET, "cpu-avx2"], ids=["vnni", "avx2"])
@pytest.mark.parametrize("at", [32, 64, 128])
def test_q4_rows_whose_activations_start_at_any_block(target, at):
    for fmt in ("q4_0", "q4_k"):
        layer = quant_linear(fmt, 768, 5, True, BF16)
        x = torch.randn(1, 768 + at).to(BF16)
        prog, _ = cpu_compile(_Sliced(layer, at), (x,), {"QDOT": "vnni"}, target=target)
        assert f"&st_xq_x, (a1_o * 32 + {at}) / 32" in prog.source("c")
        got, want = prog(x).double(), _Sliced(layer, at)(x.double()).double()
        assert ((got - want).norm() / want.norm()).item() < 1.5e-2
        QuantLinear.int8_activations = True
        try:
            rounded = _Sliced(layer, at)(x.float()).double()
        finally:
            QuantLinear.int8_activations = False
        assert ((got - rounded).norm() / rounded.norm()).item() < 8e-3      # bf16 rounding only


class _UpcastRow(torch.nn.Module):
    """A bf16 model's last down projection as a decode step has it: its output added to the
    residual and cast to float32 (the final norm's upcast), so the row writes f32."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, residual):
        return (residual + self.layer(x)).float()


def test_a_bf16_row_writing_f32_takes_int8_activations():
    """A row whose weights are rounded to bf16 is a 16-bit model's, whatever it writes: it took
    the float lanes when fused into an upcast (1.6x slower than its siblings)."""
    layer = quant_linear("q6_k", 512, 24, False, BF16)
    model, x, residual = _UpcastRow(layer), torch.randn(1, 512).to(BF16), torch.randn(1, 24).to(BF16)
    prog, _ = cpu_compile(model, (x, residual), target=VNNI_TARGET)
    rows = [k for k in prog.lowered.kernel.kernels if "QDOT" in dict(k.knobs)]
    assert rows and all(dict(k.knobs)["QDOT"] == "vnni" for k in rows)
    assert "st_q6_k_vnni_bf16((" in prog.source("c") or "st_q6_k_vnni_f16((" in prog.source("c")
    got, want = prog(x, residual).double(), model(x, residual).double()
    assert got.dtype == want.dtype and ((got - want).norm() / want.norm()).item() < 1.5e-2


def test_f32_rows_keep_float_lanes_unless_pinned_and_f16_scales_run_too():
    layer, x = quant_linear("q4_0", 512, 40, False, torch.float32), torch.randn(1, 512)
    prog, _ = cpu_compile(layer, (x,), target=VNNI_TARGET)
    assert knobs_of(prog, "k_linear_reduce")["QDOT"] == "float" and "_vnni_f16((" not in prog.source("c")
    prog, _ = cpu_compile(layer, (x,), {"QDOT": "vnni"}, target=VNNI_TARGET)
    assert "st_q4_0_vnni_f16((" in prog.source("c")      # the f32 layer keeps its f16 scales
    got, want = prog(x).double(), layer(x).double()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 1e-2 and (rel > 1e-6 or not VNNI), f"int8 activations: rel err {rel:.3g}"


def test_int8_rows_where_vpdpbusd_or_avx2s_vpmaddubsw_run_them():
    """AVX-512 without VNNI (Skylake) and x86-64 without AVX2 keep the float lanes; AVX2 without
    AVX-512 (Zen 3, Haswell) runs the int8 blocks on vpmaddubsw: where the host is such a CPU, its
    rows are int8's, not the float lanes' (their error is larger than a float sum's)."""
    layer, x = quant_linear("q8_0", 64, 8, False, BF16), torch.randn(1, 64).to(BF16)
    x86 = host().features - {"avx512_vnni", "avx_vnni", "avx512f", "avx2"}
    for features in (x86 | {"avx2", "fma", "f16c", "avx512f"}, x86 | {"fma", "f16c"}):
        prog, _ = cpu_compile(layer, (x,), target=replace(host(), features=frozenset(features)))
        assert "QDOT" not in knobs_of(prog, "k_linear_reduce") and "_vnni_bf16((" not in prog.source("c")
    avx2 = replace(host(), name="cpu-avx2-fma", features=frozenset(x86 | {"avx2", "fma", "f16c"}))
    prog, _ = cpu_compile(layer, (x,), target=avx2)
    assert knobs_of(prog, "k_linear_reduce")["QDOT"] == "vnni" and "st_q8_0_vnni_bf16((" in prog.source("c")
    assert_matches(prog, layer, (x,))
    if host().has("avx2") and not host().has("avx512f"):
        layer, x = quant_linear("q4_0", 512, 40, False, torch.float32), torch.randn(1, 512)
        got = cpu_compile(layer, (x,), {"QDOT": "vnni"})[0](x).double()
        rel = ((got - layer(x).double()).norm() / layer(x).double().norm()).item()
        assert 1e-6 < rel < 1e-2, f"int8 activations on vpmaddubsw: rel err {rel:.3g}"


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [BF16, torch.float32], ids=str)
def test_int8_per_channel_and_int4_per_group_rows_and_products_match_eager(fmt, dtype):
    """A Hugging Face weight quantized at load: bf16 scales, one a row (int8) or one per 32
    (int4: q4_0's nibbles); a decode row and a 7-row product, K not a multiple of 32."""
    layer = quant_linear(fmt, 200, 45, True, dtype)
    assert layer.d.dtype == BF16 and layer.d.shape[1] == (1 if fmt == "int8" else 7)
    for m in (1, 7):
        x = torch.randn(m, 200).to(dtype)
        prog, _ = cpu_compile(layer, (x,))
        assert_matches(prog, layer, (x,))
    x = torch.randn(1, 256).to(BF16)
    prog, _ = cpu_compile(quant_linear(fmt, 256, 16, False, BF16), (x,), target=VNNI_TARGET)
    assert ("st_q4_0_vnni_bf16((" in prog.source("c")) == (fmt == "int4")   # int8: one scale a row


@pytest.mark.parametrize("target", [VNNI_TARGET, "cpu-avx2"], ids=["vnni", "avx2"])
def test_a_nan_or_an_infinity_in_the_activations_is_never_a_finite_output(target):
    """int8 activations scale a block by its max |x|: a NaN in the block was skipped by that max
    and rounded to some byte, so the row's output was finite garbage where eager's is NaN."""
    layer = quant_linear("q4_0", 256, 8, False, BF16)
    prog, _ = cpu_compile(layer, (torch.randn(1, 256).to(BF16),), {"QDOT": "vnni"}, target=target)
    for bad in (float("nan"), float("inf")):
        x = torch.randn(1, 256).to(BF16)
        x[0, 100] = bad
        assert not prog(x).isfinite().any(), bad
