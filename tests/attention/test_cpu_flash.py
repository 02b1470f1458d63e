"""Attention on a CPU as one flash kernel (tile/passes/cpu_attention.py, kernel_ir/
lower_attention_cpu.py), run natively and compared with float64 eager: causal or not, odd
lengths, more keys than queries, GQA, head dims that are no whole vector, bf16, transformers'
additive and boolean masks, pinned blocks; FLASH=0 and short prompts keep the matmul and softmax
kernels; a block size that is no whole register tile is one sentence."""
import io
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import strata
from attention_helpers import sdpa_mask
from conftest import HAS_CC
from strata.bench import check
from strata.core.context import Context
from strata.core.errors import KnobError
from strata.core.targets import host

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


def _run(fn, inputs, knobs=None):
    prog = strata.compile(fn, inputs, device="cpu", ctx=Context(knobs=dict(knobs or {})))
    for res in check.verify(prog, fn, inputs, True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"
    return prog


def _flash(prog) -> bool:
    return any(t.mode == "attention" for t in prog.lowered.tile.kernels)


def _sdpa(causal, gqa=False):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


@pytest.mark.parametrize("lq,lk,h,hk,d,dv,causal,dt", [
    (130, 130, 2, 2, 64, 64, True, torch.float32),
    (67, 67, 3, 3, 40, 40, False, torch.float32),      # a head dim of 2.5 vectors, one odd block
    (64, 200, 2, 2, 64, 24, True, torch.float32),      # keys past the queries: causal offset 136
    (131, 131, 4, 2, 80, 80, True, torch.float32),     # GQA, two query heads a KV head
    (96, 96, 2, 2, 128, 128, True, torch.bfloat16),
    (150, 150, 2, 1, 41, 24, True, torch.bfloat16),    # an odd head dim: q and k padded to pairs
], ids=["causal", "odd-d40", "offset-dv24", "gqa-d80", "bf16-d128", "bf16-d41-gqa"])
def test_flash_matches_eager(lq, lk, h, hk, d, dv, causal, dt):
    torch.manual_seed(0)
    q = torch.randn(1, h, lq, d, dtype=dt)
    k, v = torch.randn(1, hk, lk, d, dtype=dt), torch.randn(1, hk, lk, dv, dtype=dt)
    prog = _run(_sdpa(causal, hk != h), (q, k, v))
    assert _flash(prog) and len(prog.lowered.kernel.kernels) == 1
    form = "pairsbf16" if dt == torch.bfloat16 and host().has("avx512_bf16") else "outerfma"
    assert prog.ir("kernel").count(form) >= 2, f"the block products are not {form} register tiles"


@pytest.mark.parametrize("kind", ["additive", "boolean"])
def test_transformers_masks(kind):
    """The masks transformers passes SDPA, read per (query, key) inside the kernel."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 70, 32) for _ in range(3))
    mask = sdpa_mask(kind, (1, 2, 70, 70))
    if kind == "additive":
        mask = mask.float()
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert _flash(_run(fn, (q, k, v, mask)))


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("knobs", [{"BLOCK_M": 4, "BLOCK_N": 4}, {"BLOCK_M": 128, "BLOCK_N": 32},
                                   {"BLOCK_M": 20, "BLOCK_N": 12}])
def test_pinned_blocks(knobs, dt):
    """Blocks of one register tile, larger than the prompt, and of no whole vector of queries
    (those columns run as the loop is written) all give eager's numbers."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 2, 90, 64, dtype=dt) for _ in range(3))
    prog = _run(_sdpa(True), (q, k, v), knobs)
    assert dict(prog.lowered.tile.kernels[0].knobs)["BLOCK_M"] == knobs["BLOCK_M"]


@pytest.mark.skipif(not host().has("avx512_bf16"), reason="bf16 blocks of 128 queries are the "
                    "AVX512-BF16 kernel's rule; this CPU has no AVX512-BF16")
def test_bf16_blocks_of_128_queries_from_512():
    """The tuner found 64 faster at 128 queries (a block of 128 computes the whole masked
    diagonal); 128 wins from 512 (Zen 4: 0.83x at 128, 1.01x at 512, 1.04x at 1024)."""
    def block_m(n):
        q = torch.randn(1, 2, n, 64, dtype=torch.bfloat16)
        prog = strata.compile(_sdpa(True), (q, q, q), device="cpu", until="tile")
        return dict(prog.lowered.tile.kernels[0].knobs)["BLOCK_M"]
    assert (block_m(128), block_m(511), block_m(512)) == (64, 64, 128)


def test_short_prompts_and_flash_0_keep_the_three_kernels():
    torch.manual_seed(3)
    short = tuple(torch.randn(1, 2, 16, 64) for _ in range(3))
    assert not _flash(_run(_sdpa(True), short))
    assert _flash(_run(_sdpa(True), short, {"FLASH": 1}))
    long = tuple(torch.randn(1, 2, 130, 64) for _ in range(3))
    assert not _flash(_run(_sdpa(True), long, {"FLASH": 0}))


@pytest.mark.skipif(not host().has("avx2"), reason="this CPU lacks AVX2: C built for the AVX2 "
                    "target cannot run here")
@pytest.mark.parametrize("knobs", [{}, {"BLOCK_M": 20, "BLOCK_N": 28}, {"BLOCK_M": 4, "BLOCK_N": 8}],
                         ids=str)
def test_avx2_tiles_of_6_rows_and_their_tails(knobs):
    """On AVX2 the register tiles are 6 x 16 (blocks of 48 queries by 96 keys by default); rows
    past a block's last whole tile (20 = 3 x 6 + 2, 4 < 6) take one tile of fewer."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 101, 64) for _ in range(3))
    log = io.StringIO()
    ctx = Context(knobs=knobs, verbosity=2, stream=log, target="cpu-avx2")
    prog = strata.compile(_sdpa(True), (q, k, v), device="cpu", ctx=ctx)
    for res in check.verify(prog, _sdpa(True), (q, k, v), True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"
    bm, bn = knobs.get("BLOCK_M", 48), knobs.get("BLOCK_N", 96)
    assert f"{bm} queries x {bn} keys a step" in log.getvalue()
    assert "register tiles of 6 x 16" in log.getvalue()


@pytest.mark.parametrize("lq,lk,knobs", [(100, 100, {"BLOCK_M": 8, "BLOCK_N": 16}),
                                         (37, 90, {"BLOCK_M": 12, "BLOCK_N": 40})],
                         ids=["square", "more-keys"])
def test_a_diagonal_block_stops_at_the_keys_its_last_query_sees(lq, lk, knobs):
    """Keys past kv_hi are masked for every query of a block, so its copies, scores, exps and
    both products stop at kv_n: a block of 8 queries on a diagonal block of 16 keys runs the
    first 8 or all 16 (a tile of fewer rows where 8 is no whole number of tiles), and the
    answers stay eager's, with more keys than queries too."""
    torch.manual_seed(5)
    q, k, v = torch.randn(1, 2, lq, 64), torch.randn(1, 2, lk, 64), torch.randn(1, 2, lk, 64)
    prog = _run(_sdpa(True), (q, k, v), {"FLASH": 1, **knobs})
    assert prog.lowered.tile.kernels[0].attention.causal is not None
    text = prog.ir("kernel")
    assert f"kv_n = minimum({knobs['BLOCK_N']}, kv_hi - j0)" in text
    assert text.count("; < kv_n; += 1:") >= 4          # copies (whole and edge), scores, exps


def test_a_block_of_no_whole_tile_is_one_sentence():
    q = torch.randn(1, 2, 70, 64)
    with pytest.raises(KnobError, match="multiples of 4"):
        strata.compile(_sdpa(True), (q, q, q), device="cpu", ctx=Context(knobs={"BLOCK_M": 6}))


@pytest.mark.parametrize("layer", [None, 0], ids=["model", "layer"])
def test_a_llama_prefill_skips_the_keys_past_the_diagonal_and_stores_its_roped_keys(tmp_path, layer):
    """A model's prefill as strata builds it (the whole model: transformers' mask with its
    packed-sequence test, and(same sequence, j <= i); one layer: where(j - i >= 1, MIN, 0), a
    test of the masked keys) has a causal limit, and K after RoPE (sines and cosines of the
    positions) is stored once instead of computed again for every block of queries."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    from model_helpers import hf_model, write_checkpoint
    from strata.api import compile_model
    model = write_checkpoint(hf_model("llama", num_hidden_layers=1, max_position_embeddings=256),
                             tmp_path / "llama")
    prog, built = compile_model(str(model), layer=layer, seq_len=100, device="cpu", materialise=True)
    (att,) = [t.attention for t in prog.lowered.tile.kernels if t.mode == "attention"]
    assert att.causal is not None and att.causal.keep == (layer is None) and att.causal.offset == 0
    assert len(att.op.k.body) == 1 and "rotary" not in str(att.op.k.body[0])
    for res in check.verify(prog, built.module, built.example_inputs, True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"


@pytest.mark.parametrize("target,dt", [("cpu-znver4", torch.bfloat16), ("cpu-avx2", torch.float32)])
def test_the_flash_kernel_of_another_cpu_on_the_simulator(target, dt):
    """The pairs form (bf16 on AVX512-BF16) and the outer form, lowered for a CPU this machine
    may not be and run on the simulator: causal, 61 queries in blocks of 8 by 12 keys (tails of
    both), each block's accumulators rescaled as the P @ V tiles load them."""
    from strata.api import to_numpy
    from strata.kernel_ir.sim import simulate
    fn = _sdpa(True)
    inputs = tuple(torch.randn(1, 1, 61, 32, dtype=dt) for _ in range(3))
    prog = strata.compile(fn, inputs, device="cpu", until="kernel", ctx=Context(
        target=target, knobs={"FLASH": 1, "BLOCK_M": 8, "BLOCK_N": 12}))
    assert _flash(prog)
    feed = {name: to_numpy(x) for name, x in zip(prog.torch_program.inputs, inputs)}
    out = simulate(prog.lowered.kernel, feed)[prog.lowered.kernel.outputs[0]]
    res = check.compare("o", "f32", out, check.eager_reference(fn, inputs)[0], 1e-2)
    assert res.passed, res
