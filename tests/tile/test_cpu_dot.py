"""CPU contractions in the dot form (cpu_matmul FORM=dot: vectors along K, no packing) and the
C target's vdpbf16ps loops (codegen/c_dot.py). Run natively and compared with float64 eager at
odd, prime and size-1 shapes, K in chunks or not, one and two reductions, bf16 and f32."""
import io
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import strata
from conftest import HAS_CC
from strata.bench import check
from strata.core.context import Context
from strata.core.expr import Const, Var, add, call
from strata.kernel_ir.cpu_ir import DotBf16
from strata.kernel_ir.ir import Assign, For, Kernel, Let, Load, Param, Store
from strata.kernel_ir.lower_cpu import lower_cpu_forms
from strata.core.targets import host
from strata.tile.ir import format_kernel

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")
BF16 = torch.bfloat16
HAS_DP = host().has("avx512_bf16")
NO_AMX = replace(host(), features=host().features - {"amx_tile", "amx_bf16"})   # the forms without AMX


def cpu_compile(fn, inputs, knobs=None, target=None):
    log = io.StringIO()
    ctx = Context(knobs=knobs or {}, verbosity=2, stream=log, target=target or NO_AMX)
    return strata.compile(fn, inputs, device="cpu", ctx=ctx), log.getvalue()


def assert_matches(prog, fn, inputs):
    for res in check.verify(prog, fn, inputs, True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"


def knobs_of(prog, name: str) -> dict:
    return dict(next(k for k in prog.lowered.tile.kernels if k.name == name).knobs)


@pytest.mark.parametrize("knobs", [{}, {"K_CHUNK": 32}, {"THREAD_M": 3, "TILE_N": 4}], ids=str)
@pytest.mark.parametrize("m,n,k", [(2, 8, 64), (21, 45, 67), (3, 5, 1), (37, 13, 100), (1, 7, 33)],
                         ids=str)
def test_a_bf16_linear_in_the_dot_form_matches_eager(m, n, k, knobs):
    x, w = torch.randn(m, k).to(BF16), torch.randn(n, k).to(BF16)
    prog, _ = cpu_compile(F.linear, (x, w), {"FORM": "dot", **knobs})
    if m > 1:                           # (one row is a matrix-vector product: rows already)
        k_ = knobs_of(prog, "k_linear_reduce")
        assert k_["FORM"] == "dot"
        assert k_["K_CHUNK"] == (knobs.get("K_CHUNK", 0) if k > knobs.get("K_CHUNK", k) else 0)
    assert_matches(prog, F.linear, (x, w))


def test_gate_and_up_in_k_chunks_match_eager():
    """Two reductions per register tile, their sums kept across K chunks in the block scratch."""
    def mlp(x, wg, wu):
        return F.silu(F.linear(x, wg)) * F.linear(x, wu)
    x, wg, wu = torch.randn(19, 97).to(BF16), torch.randn(23, 97).to(BF16), torch.randn(23, 97).to(BF16)
    for knobs in ({"FORM": "dot", "K_CHUNK": 32}, {"FORM": "dot"}):
        prog, log = cpu_compile(mlp, (x, wg, wu), knobs)
        assert "dot products along K" in log
        assert_matches(prog, mlp, (x, wg, wu))


def test_the_dot_form_of_an_f32_matmul_and_of_a_normed_operand_match_eager():
    x, w = torch.randn(10, 130), torch.randn(17, 130)
    prog, _ = cpu_compile(F.linear, (x, w), {"FORM": "dot"})
    assert_matches(prog, F.linear, (x, w))

    def normed(x, g, w):                # RMSNorm's output stored once, in bf16 as eager holds it
        return F.linear(F.rms_norm(x, (x.shape[-1],), g), w)
    x, g, w = torch.randn(9, 64).to(BF16), torch.randn(64).to(BF16), torch.randn(40, 64).to(BF16)
    prog, log = cpu_compile(normed, (x, g, w), {"FORM": "dot"})
    assert "bf16 by" in log, log
    assert_matches(prog, normed, (x, g, w))


@pytest.mark.parametrize("m,n,k", [(2, 7, 66), (37, 45, 300), (130, 33, 258)], ids=str)
def test_a_bf16_weight_defaults_to_the_pairs_form_packed_once(m, n, k):
    """A layer's bf16 weight is packed into K pairs once, when the program is loaded, so the
    pairs form runs at every M (a weight given as an input, or PACK=call, keeps the dot form).
    The choice is checked for Zen 4 on any machine; the result where vdpbf16ps runs."""
    lin = torch.nn.Linear(k, n).to(BF16).eval().requires_grad_(False)
    x, target = torch.randn(m, k).to(BF16), NO_AMX if HAS_DP else "cpu-znver4"
    prog, log = cpu_compile(lin, (x,), target=target)
    knobs = knobs_of(prog, "k_linear_reduce")
    assert (knobs["FORM"], knobs["PACK"]) == ("pairs", "once") and "run once: a weight" in log
    called, _ = cpu_compile(lin, (x,), {"PACK": "call"}, target=target)
    assert knobs_of(called, "k_linear_reduce")["FORM"] == "dot"
    if HAS_DP:
        assert_matches(prog, lin, (x,))
        assert_matches(called, lin, (x,))


def test_weights_that_would_not_fit_packed_keep_the_dot_form(monkeypatch):
    """Where a packed copy of the weights could not take under half the free memory (the
    runtime would pack them per call), the program is compiled with PACK=call: bf16 linears read
    their weights as they lie, in the dot form."""
    lin = torch.nn.Linear(300, 45).to(BF16).eval().requires_grad_(False)
    x, target = torch.randn(37, 300).to(BF16), NO_AMX if HAS_DP else "cpu-znver4"
    monkeypatch.setattr("strata.pipeline.available_bytes", lambda: 2 * 300 * 45)
    prog, log = cpu_compile(lin, (x,), target=target)
    assert knobs_of(prog, "k_linear_reduce")["FORM"] == "dot" and "PACK=call: the weights" in log
    assert "run once" not in log
    if HAS_DP:
        assert_matches(prog, lin, (x,))


@pytest.mark.parametrize("rows, form", [(8, "dot"), (32, "dot"), (33, "pairs")])
def test_a_decode_steps_scores_over_a_bf16_cache_run_in_the_dot_form(rows, form):
    """q @ k^T of a few query rows (GQA's 8 per KV head) over a cache, K = 64: the dot form reads
    the keys as they lie from K = 64 where M is at most 32 (packing them cost 2x its time)."""
    def scores(q, k):
        return torch.matmul(q, k.transpose(-1, -2))
    q, k = torch.randn(1, 2, rows, 64).to(BF16), torch.randn(1, 2, 37, 64).to(BF16)
    prog, _ = cpu_compile(scores, (q, k), target=NO_AMX if HAS_DP else "cpu-znver4")
    assert knobs_of(prog, "k_matmul_reduce")["FORM"] == form
    if HAS_DP:
        assert_matches(prog, scores, (q, k))


@pytest.mark.skipif(not HAS_DP, reason="this CPU has no AVX512-BF16: the dot form is not the "
                                       "default and vdpbf16ps cannot run")
def test_bf16_linears_default_to_vdpbf16ps_and_attention_values_do_not():
    x, w = torch.randn(33, 300).to(BF16), torch.randn(24, 300).to(BF16)
    prog, _ = cpu_compile(F.linear, (x, w))
    assert knobs_of(prog, "k_linear_reduce")["FORM"] == "dot"
    assert "_mm512_dpbf16_ps(" in prog.lowered.source
    assert_matches(prog, F.linear, (x, w))
    for k, form in ((70, "pairs"), (69, "outer")):     # K too short: pairs if K is even
        prog, _ = cpu_compile(F.linear, (x[:, :k], w[:, :k]))
        assert knobs_of(prog, "k_linear_reduce")["FORM"] == form
        assert_matches(prog, F.linear, (x[:, :k], w[:, :k]))

    p, v = torch.randn(2, 9, 9).to(BF16), torch.randn(2, 9, 16).to(BF16)   # V is not contiguous along K
    prog, _ = cpu_compile(torch.bmm, (p, v))
    assert all(dict(k.knobs).get("FORM") != "dot" for k in prog.lowered.tile.kernels)
    prog, _ = cpu_compile(F.linear, (x, w), target="cpu-avx2")              # no AVX512-BF16
    assert knobs_of(prog, "k_linear_reduce")["FORM"] == "outer"


@pytest.mark.skipif(not HAS_DP, reason="this CPU has no AVX512-BF16: the dot form is not the "
                                       "default")
def test_an_m_side_operand_not_contiguous_along_k_is_stored_once_in_bf16():
    """Attention's output before o_proj is read across heads: stored contiguous (exactly, in
    bf16), then the dot form reads it with vdpbf16ps."""
    def o_proj(a, w):                   # a: (K, M), read transposed
        return F.linear(a.t(), w)
    a, w = torch.randn(300, 11).to(BF16), torch.randn(24, 300).to(BF16)
    prog, log = cpu_compile(o_proj, (a, w))
    assert "bf16 by" in log, log
    assert any(dict(k.knobs).get("FORM") == "dot" for k in prog.lowered.tile.kernels)
    assert "_mm512_dpbf16_ps(" in prog.lowered.source
    assert_matches(prog, o_proj, (a, w))


@pytest.mark.skipif(not HAS_DP, reason="this CPU has no AVX512-BF16: the pairs form is not the "
                                       "default")
@pytest.mark.parametrize("m,n,k", [(256, 64, 256), (263, 45, 301), (100, 45, 302)], ids=str)
def test_a_k_by_n_bf16_operand_runs_in_pairs_at_any_m(m, n, k):
    """`x @ w` with w (K, N), contiguous along N, an input (packed per call): the pairs form
    when K is even, at any M and with PROLOGUE=fuse too (storing w transposed for the dot form
    took 1.5x to 2x its time at M = 256 to 1024); an odd K runs in the packed f32 form."""
    x, w = torch.randn(m, k).to(BF16), torch.randn(k, n).to(BF16)
    for knobs in ({}, {"PROLOGUE": "fuse"}):
        prog, log = cpu_compile(torch.matmul, (x, w), knobs)
        assert knobs_of(prog, "k_matmul_reduce")["FORM"] == ("pairs" if k % 2 == 0 else "outer")
        assert "transposed" not in log and "run once" not in log
        assert_matches(prog, torch.matmul, (x, w))
    with pytest.raises(strata.StrataError, match="strided along K"):
        cpu_compile(torch.matmul, (x, w), {"FORM": "dot"})


@pytest.mark.parametrize("dtype", [BF16, torch.float32], ids=str)
def test_a_decode_steps_attention_output_is_stored_once_for_o_proj(dtype):
    """At one token, o_proj reads attention's one row across heads: the vector is copied
    contiguous before the matrix-vector product."""
    def o_proj(o, w):
        return F.linear(torch.relu(o).transpose(1, 2).reshape(1, 1, -1), w)
    o, w = torch.randn(1, 4, 1, 64).to(dtype), torch.randn(24, 256).to(dtype)
    prog, _ = cpu_compile(o_proj, (o, w))
    assert_matches(prog, o_proj, (o, w))


@pytest.mark.skipif(not HAS_DP, reason="this CPU has no AVX512-BF16: FORM=pairs falls back to "
                                       "the packed form")
@pytest.mark.parametrize("m,n,k", [(2, 16, 2), (13, 45, 66), (64, 32, 256), (1, 7, 30)], ids=str)
def test_the_pairs_form_matches_eager(m, n, k):
    """FORM=pairs: a bf16 panel with K in pairs per column, vdpbf16ps along N (rows past M and
    columns past N read the last one again; their points are not stored)."""
    x, w = torch.randn(m, k).to(BF16), torch.randn(k, n).to(BF16)
    prog, log = cpu_compile(torch.matmul, (x, w), {"FORM": "pairs"})
    if m > 1:
        kernel = next(k for k in prog.lowered.tile.kernels if k.name == "k_matmul_reduce")
        assert dict(kernel.knobs)["FORM"] == "pairs" and "K pairs" in format_kernel(kernel)
        assert "vdpbf16ps on pairs of K" in prog.lowered.source
    assert_matches(prog, torch.matmul, (x, w))


@pytest.mark.skipif(not HAS_DP, reason="this CPU has no AVX512-BF16: FORM=pairs falls back to "
                                       "the packed form")
def test_the_pairs_form_of_attention_values_and_its_fallbacks():
    """P @ V batched runs in pairs; an odd K, or f32 operands, fall back to the packed form."""
    p, v = torch.randn(3, 10, 24).to(BF16), torch.randn(3, 24, 32).to(BF16)
    prog, _ = cpu_compile(torch.bmm, (p, v), {"FORM": "pairs"})
    assert any(dict(k.knobs).get("FORM") == "pairs" for k in prog.lowered.tile.kernels)
    assert_matches(prog, torch.bmm, (p, v))
    for inputs in ((p[:, :, :23], v[:, :23]), (p.float(), v.float())):
        prog, _ = cpu_compile(torch.bmm, inputs, {"FORM": "pairs"})
        assert all(dict(k.knobs).get("FORM") in (None, "outer") for k in prog.lowered.tile.kernels)
        assert_matches(prog, torch.bmm, inputs)


def _loop(*body, step=1) -> For:
    return For("k", Const(0), Const(70), step, body, dtype="i32")


def _dot_body(index_a=None):
    k = Var("k", "i32")
    a = Let("a", "f32", Load("x", index_a or add(k, Const(70)), "f32"))
    b = Let("b", "f32", Load("w", k, "f32"))
    p = Let("p", "f32", call("multiply", Var("a", "f32"), Var("b", "f32")))
    return a, b, p, Assign("acc", call("add", Var("acc", "f32"), Var("p", "f32")))


def _chosen(loop: For, x: str = "bf16", form=None):
    """The statement lower_cpu_forms makes of `loop` in a row kernel (no FORM) or a FORM one."""
    params = (Param("x", x, 140, False), Param("w", "bf16", 70, False), Param("y", "f32", 1, True))
    body = (Let("acc", "f32", Const(0.0, "f32")), loop, Store("y", Const(0), Var("acc", "f32")))
    k = Kernel("k", params, 1, 1, body, knobs=(("FORM", form),) if form else ())
    return lower_cpu_forms(k).body[1]


def test_only_a_loop_of_contiguous_bf16_products_and_sums_becomes_vdpbf16ps():
    dot = _chosen(_loop(*_dot_body()))
    assert isinstance(dot, DotBf16) and dot.accs == (("acc", "a", "b"),) and dot.check() is None
    assert "dotbf16 1 sums (vdpbf16ps along K) for k = 0; < 70" in dot.to_text(str)
    assert isinstance(_chosen(_loop(*_dot_body()), form="dot"), DotBf16)
    for loop, x, form in ((_loop(*_dot_body(), step=2), "bf16", None),
                          (_loop(*_dot_body(call("multiply", Var("k", "i32"), Const(2)))), "bf16", None),
                          (_loop(*_dot_body()), "f32", None),                    # not bf16
                          (_loop(*_dot_body(), Let("e", "f32", call("exp", Var("a", "f32")))), "bf16", None),
                          (_loop(*_dot_body()), "bf16", "outer")):       # not the kernel's FORM
        assert type(_chosen(loop, x, form)) is For


@pytest.mark.parametrize("m,form", [(16, "dot"), (37, "dot"), (100, "outer")], ids=str)
def test_f32_linears_with_few_rows_default_to_the_dot_form(m, form):
    """Packing the weight's panel costs what the dot form's whole work does at small M; the
    packed form's edge tile (M not a multiple of THREAD_M) reads the last row again. With 16
    vector registers (AVX2) the dot form's 2 x 8 accumulators fill them: up to 24 rows only."""
    if m > 24 and host().vector_registers < 32:
        form = "outer"
    x, w = torch.randn(m, 300), torch.randn(40, 300)
    prog, _ = cpu_compile(F.linear, (x, w))
    assert knobs_of(prog, "k_linear_reduce")["FORM"] == form
    assert_matches(prog, F.linear, (x, w))


@pytest.mark.parametrize("m,n,k", [(128, 96, 64), (37, 45, 68)], ids=str)
@pytest.mark.parametrize("target", [None, "cpu-avx2"])
def test_an_f32_weight_cast_to_bf16_is_stored_in_bf16_first(m, n, k, target):
    """Autocast's product (x and an f32 weight both cast to bf16, as a training step's forward
    runs): where the CPU multiplies bf16 the cast weight is stored once in bf16 by a kernel of its
    own and the product takes a bf16 form, not an f32 panel; AVX2 packs the cast into its panel."""
    def autocast_linear(x, w):
        return x.to(BF16) @ w.to(BF16).t()
    x, w = torch.randn(m, k), torch.randn(n, k)
    prog, log = cpu_compile(autocast_linear, (x, w), target=target)
    kernels = {kk.name: dict(kk.knobs) for kk in prog.lowered.tile.kernels}
    stored = any(name.endswith("_prologue_w") for name in kernels)
    forms = {kn.get("FORM") for kn in kernels.values()} - {None}
    bf16_cpu = target is None and HAS_DP
    assert stored == bf16_cpu and (forms <= {"dot", "pairs", "amx"} if bf16_cpu else forms == {"outer"})
    assert_matches(prog, autocast_linear, (x, w))
