"""The CPU contraction schedule (tile/passes/cpu_matmul.py -> kernel_ir/lower_matmul.py -> codegen/c.py):
a packed, register-tiled micro-kernel, run natively and compared with eager at the edges its
tiles have (M and N not multiples of the register tile, prime K, one row, one column), with
16-bit operands, prologues on either side, fused epilogues, strided inputs, batches and every
knob it prints. A matrix-vector product is declined (rows of dot products) and says so."""
import io

import pytest
import torch
import torch.nn.functional as F

import strata
from conftest import HAS_CC
from strata.bench import check
from strata.core.context import Context
from strata.core.errors import KnobError

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")
r = torch.randn


def cpu_compile(fn, inputs, knobs=None, verbose=0):
    log = io.StringIO()
    ctx = Context(knobs=knobs or {}, verbosity=verbose, stream=log)
    return strata.compile(fn, inputs, device="cpu", ctx=ctx), log.getvalue()


def assert_cpu_matches(fn, inputs, knobs=None):
    """Natively on the CPU, every output within the contraction tolerance of float64 eager;
    returns the program's matmul tile kernels (so tests can check the schedule was used)."""
    prog, _ = cpu_compile(fn, inputs, knobs)
    for res in check.verify(prog, fn, inputs, True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"
    return [k for k in prog.lowered.tile.kernels if k.mode == "matmul"]


@pytest.mark.parametrize("m,n,k", [(6, 32, 1), (7, 33, 5), (61, 91, 257), (1, 2, 3), (13, 1, 31),
                                   (2, 257, 17), (97, 17, 64)], ids=str)
def test_mm_edges(m, n, k):
    tiles = assert_cpu_matches(torch.mm, (r(m, k), r(k, n)))
    if min(m, n, k) > 1:                  # one row or column: a matrix-vector product
        assert tiles and all(t.matmul.serial for t in tiles)


def test_blocks_take_the_m_pieces_of_a_panel_in_turn():
    """M cut in pieces (here 48 + 48 + 4 rows): block b is M piece b % 3 of panel b // 3, so each
    thread's run of blocks holds an equal share of the short piece (kernel_ir/lower_matmul.py)."""
    prog, _ = cpu_compile(torch.mm, (r(100, 24), r(24, 64)), {"TILE_M": 48, "TILE_N": 16})
    source = prog.source("c")
    assert "m0 = blockIdx % 3 * 48;" in source and "n0 = blockIdx / 3 * 16;" in source
    assert_cpu_matches(torch.mm, (r(100, 24), r(24, 64)), {"TILE_M": 48, "TILE_N": 16})


def test_m_pieces_are_near_equal_and_at_most_512_rows_n_tile_fastest():
    """Each M piece packs its panel again: M is cut only where a piece would pass 512 rows (or
    the cores need more blocks), into pieces of near-equal rows, N tile fastest so each thread
    keeps its piece's rows in cache: 2100 rows as 4 x 432 + 372 (24-row steps); 512 as one
    piece (1.12x 240 + 240 + 32 on a 2-core Zen 3, fp32 x 2048 x 5632)."""
    for m, piece, pieces in ((2100, 432, 5), (512, 528, 1)):
        prog = strata.compile(torch.mm, (r(m, 8), r(8, 4096)), ctx=Context(target="cpu-avx2"))
        source = prog.source("c")
        assert f"blockIdx < {pieces * 4096 // 16};" in source and f"mi < {piece // 6};" in source
        assert (f"m0 = blockIdx / 256 * {piece};" if pieces > 1 else "m0 = 0;") in source
    assert_cpu_matches(torch.mm, (r(1031, 7), r(7, 40)))


def test_schedule_prints_its_knobs_and_register_tiles():
    prog, log = cpu_compile(torch.mm, (r(61, 40), r(40, 91)), verbose=2)
    [tile] = prog.lowered.tile.kernels
    text = str(tile)
    assert "register tiles, in turn" in text and "_panel" in text and "tail" in text
    assert {"TILE_M", "TILE_N", "THREAD_M"} <= set(dict(tile.knobs))
    assert "cpu_matmul" in log and "register tiles" in log
    source = prog.source("c")
    assert "fma" in source and "st_scratch" in source


@pytest.mark.parametrize("knobs", [{"THREAD_M": 4, "TILE_N": 16}, {"THREAD_M": 1, "TILE_N": 8},
                                   {"TILE_M": 24, "THREAD_M": 3}, {"THREAD_M": 8, "TILE_N": 64}],
                         ids=str)
def test_knobs_change_the_tiles_not_the_values(knobs):
    [tile] = assert_cpu_matches(torch.mm, (r(37, 29), r(29, 71)), knobs)
    for name, value in knobs.items():
        assert dict(tile.knobs)[name] == value


def test_register_tile_must_divide_the_block():
    with pytest.raises(KnobError, match="must divide"):
        cpu_compile(torch.mm, (r(37, 29), r(29, 71)), {"TILE_M": 8, "THREAD_M": 6})


def test_dot_form_refuses_a_weight_strided_along_k():
    """FORM=dot pinned on `x @ w` of a (K, N) f32 matrix is one sentence, not a loop of strided
    gathers gcc takes minutes over; a weight stored (N, K), as F.linear's, takes it."""
    with pytest.raises(KnobError, match="strided along K"):
        cpu_compile(torch.mm, (r(37, 29), r(29, 71)), {"FORM": "dot"})
    [tile] = assert_cpu_matches(F.linear, (r(37, 29), r(71, 29)), {"FORM": "dot"})
    assert dict(tile.knobs)["FORM"] == "dot"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_operands_widen_in_registers(dtype):
    x, w, b = r(19, 67).to(dtype), r(45, 67).to(dtype), r(45).to(dtype)
    assert assert_cpu_matches(F.linear, (x, w, b))


def test_prologues_on_both_sides_and_a_fused_epilogue():
    def fn(x, s, w, res):
        return F.gelu(torch.relu(x * s) @ (w + 1.0)) + res
    assert assert_cpu_matches(fn, (r(23, 41), r(41), r(41, 53), r(23, 53)))


def test_strided_and_batched_operands():
    assert assert_cpu_matches(lambda a, b: a.t() @ b.t(), (r(31, 17), r(43, 31)))
    assert assert_cpu_matches(torch.bmm, (r(3, 13, 29), r(3, 29, 37)))
    assert assert_cpu_matches(lambda a, b: torch.matmul(a, b), (r(2, 1, 11, 7), r(3, 7, 19)))


def test_empty_k_gives_the_bias():
    assert_cpu_matches(lambda x, w, b: F.linear(x, w, b), (r(5, 0), r(7, 0), r(7)))


def test_matrix_vector_is_declined_and_says_why():
    prog, log = cpu_compile(torch.mv, (r(37, 64), r(64)), verbose=1)
    assert all(k.mode != "matmul" for k in prog.lowered.tile.kernels)
    assert "declined, a matrix-vector product" in log


def rms_linear(x, g, w):
    return F.linear(F.rms_norm(x, (x.shape[-1],), g), w)


def test_a_computed_operand_is_stored_once_before_a_wide_contraction():
    """cpu_prologue: RMSNorm's normed x is computed by a kernel of its own when the projection
    has more than two panels of columns (one on AVX2), then read plainly by the micro-kernel."""
    inputs = (r(19, 67), r(67), r(131, 67))
    prog, log = cpu_compile(rms_linear, inputs, verbose=1)
    names = [k.name for k in prog.lowered.tile.kernels]
    prologue = next(n for n in names if n.endswith("_prologue"))
    assert names.index(prologue) == names.index(prologue[:-len("_prologue")]) - 1
    assert "cpu_prologue:" in log and "computed once into" in log
    assert assert_cpu_matches(rms_linear, inputs)


def heads_linear(x, w):
    """o_proj's input: attention's (1, heads, seq, head dim) output read as rows of heads x
    head dim."""
    return F.linear(x.transpose(1, 2).reshape(x.shape[2], -1), w)


def test_rows_of_heads_are_stored_contiguous_before_a_wide_contraction():
    """An f32 M-side operand whose index is not affine in K (each row jumps to the next head's
    block every head dim) is copied into contiguous rows first (o_proj ran 1.7x slower reading
    it in place); a transposed operand (a fixed stride of M) is read as it is."""
    inputs = (r(1, 3, 29, 16), r(131, 48))
    prog, _ = cpu_compile(heads_linear, inputs)
    assert any(k.name.endswith("_prologue") for k in prog.lowered.tile.kernels)
    assert assert_cpu_matches(heads_linear, inputs)
    prog, _ = cpu_compile(torch.mm, (r(48, 29).t(), r(48, 131)))
    assert not any(k.name.endswith("_prologue") for k in prog.lowered.tile.kernels)


# (13 columns are one panel of register tiles on AVX2 and on AVX-512: fused by default)
@pytest.mark.parametrize("n,knobs,stored", [(75, {"PROLOGUE": "fuse"}, False),
                                            (13, {}, False), (13, {"PROLOGUE": "materialize"}, True)],
                         ids=str)
def test_the_prologue_choice_is_a_knob(n, knobs, stored):
    inputs = (r(19, 67), r(67), r(n, 67))
    prog, _ = cpu_compile(rms_linear, inputs, knobs)
    assert any(k.name.endswith("_prologue") for k in prog.lowered.tile.kernels) == stored
    assert assert_cpu_matches(rms_linear, inputs, knobs)


@pytest.mark.parametrize("target,stored", [("cpu-znver4", False), ("cpu-avx2", True)])
def test_a_product_one_block_wide_fuses_its_prologue(target, stored):
    """64 columns are one block's panel in the outer form where 32 vector registers hold its
    6 x 4-vector tile (AVX-512), four on AVX2: fused there, stored first here. (The rule read
    the 2-vector tile for all: `strata tune` found causal attention's first query block, 64
    keys, 1.58x faster fused on Zen 5.)"""
    inputs = (r(19, 67), r(67), r(64, 67))
    prog = strata.compile(rms_linear, inputs, device="cpu", until="c", ctx=Context(target=target))
    assert any(k.name.endswith("_prologue") for k in prog.lowered.tile.kernels) == stored


@pytest.mark.parametrize("n", [75, 128])
def test_a_product_two_panels_wide_fuses_its_prologue_in_one_block(n):
    """Over one panel but at most two (AVX-512): fused, in one block N wide of register tiles of
    16 vector accumulators (2 rows of 8 vectors, 3 of 5 at N = 75), so each normed row is
    computed once (`strata tune` found causal attention's second query block, 128 keys, 1.50x
    faster so on Zen 5); AVX2 (16 registers) and a pinned TILE_N keep storing it first."""
    inputs = (r(19, 67), r(67), r(n, 67))
    prog = strata.compile(rms_linear, inputs, device="cpu", until="c",
                          ctx=Context(target="cpu-znver4"))
    [knobs] = [dict(t.knobs) for t in prog.lowered.tile.kernels if "PROLOGUE" in dict(t.knobs)]
    assert knobs["PROLOGUE"] == "fuse" and knobs["TILE_N"] == -(-n // 16) * 16
    assert knobs["THREAD_M"] == 16 // (knobs["TILE_N"] // 16)       # 16 vector accumulators
    for ctx in (Context(target="cpu-avx2"), Context(target="cpu-znver4", knobs={"TILE_N": "64"})):
        prog = strata.compile(rms_linear, inputs, device="cpu", until="c", ctx=ctx)
        assert any(k.name.endswith("_prologue") for k in prog.lowered.tile.kernels)
    assert assert_cpu_matches(rms_linear, inputs)


def test_dual_contraction_packs_two_panels():
    """The MLP's silu(x @ wg^T) * (x @ wu^T): one kernel, two packed panels, one epilogue."""
    def gated(x, wg, wu):
        return F.silu(x @ wg.t()) * (x @ wu.t())
    inputs = (r(13, 37), r(29, 37), r(29, 37))
    [tile] = assert_cpu_matches(gated, inputs)
    assert str(tile).count("_panel") >= 2


def test_block_order_is_a_knob_with_a_rule():
    """ORDER (which block loop is outermost) is decided in Tile IR and printed: M pieces fastest
    ("nm") where the last of several M pieces is short (each thread then gets an equal share of
    it), N fastest ("mn") otherwise; a pin of either order computes the same numbers."""
    short = (r(200, 24), r(24, 40))                 # TILE_M 96 pinned: pieces of 96, 96 and 8
    [tile] = assert_cpu_matches(torch.mm, short, {"TILE_M": 96})
    assert dict(tile.knobs)["ORDER"] == "nm" and "ORDER=nm" in str(tile)
    [tile] = assert_cpu_matches(torch.mm, short, {"TILE_M": 96, "ORDER": "mn"})
    assert dict(tile.knobs)["ORDER"] == "mn"
    even = (r(192, 24), r(24, 200))                # 2 M pieces by 4 N panels
    [tile] = assert_cpu_matches(torch.mm, even, {"TILE_M": 96})
    assert dict(tile.knobs)["ORDER"] == "mn"
    [tile] = assert_cpu_matches(torch.mm, even, {"TILE_M": 96, "ORDER": "nm"})
    assert dict(tile.knobs)["ORDER"] == "nm"
    sources = {o: cpu_compile(torch.mm, even, {"TILE_M": 96, "ORDER": o})[0].source("c")
               for o in ("mn", "nm")}
    assert sources["mn"] != sources["nm"]           # the lowering enumerates blocks in that order
    with pytest.raises(KnobError, match="ORDER"):
        cpu_compile(torch.mm, even, {"ORDER": "km"})
