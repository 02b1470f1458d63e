"""An f32 register tile printed as explicit vector FMAs (codegen/c_outer.py), and the tile shape
cpu_matmul picks per target: the vectors are the target's width, the tile fits its registers, and
every vector ISA computes the same bits as the scalar loop it replaces."""
import re
import shutil

import pytest
import torch

import strata
from strata.api import compile_snippet
from strata.core.context import Context
from strata.core.targets import TARGETS, host, sysfs_caches

F32_LINEAR = "torch.nn.Linear(512, 256, bias=False)(torch.randn(128, 512))"


def c_source(code: str, target: str, **knobs) -> str:
    program, _ = compile_snippet(code, Context(target=target, knobs=knobs), until="c")
    return program.ir("c")


def tile_knobs(code: str, target: str, **knobs) -> dict:
    program, _ = compile_snippet(code, Context(target=target, knobs=knobs), until="tile")
    return next(dict(k.knobs) for k in program.lowered.tile.kernels if dict(k.knobs).get("FORM"))


@pytest.mark.parametrize("target, lanes, fma, per_step", [
    ("cpu-spr", 16, "_mm512_fmadd_ps", 24),     # 6 rows x 4 vectors of 16: 24 of 32 registers
    ("cpu-avx2", 8, "_mm256_fmadd_ps", 12),     # 6 x 2 vectors of 8: 12 of 16
    ("cpu-neoverse", 4, "vfmaq_f32", 24),       # 6 x 4 vectors of 4: 24 of 32
])
def test_the_register_tile_is_vector_fmas_of_the_targets_width(target, lanes, fma, per_step):
    c = c_source(F32_LINEAR, target)       # (one source: each ISA's branch the tile fits, #if'd)
    loop = re.search(rf"// {lanes}-lane FMAs \(codegen/c_outer.py\)\n(.*?)\n#(?:elif|else)", c, re.S)
    assert loop, c[:3000]
    assert loop.group(1).count(fma) == per_step
    assert "fmaf(" in c                         # the loop as written, for other compilers


def test_tile_shapes_follow_the_registers_and_l2():
    spr, avx2 = (tile_knobs(F32_LINEAR, t) for t in ("cpu-spr", "cpu-avx2"))
    assert (spr["TILE_N"], spr["THREAD_M"]) == (64, 6)
    assert (avx2["TILE_N"], avx2["THREAD_M"]) == (16, 6)
    assert "K_CHUNK" not in spr                 # its 512 KiB panel: a quarter of cpu-spr's L2
    # a 5632-long K: four vectors' panel (1.4 MiB) takes over a quarter of L2, so K runs in chunks
    # of 512 over all the block's tiles; AVX2's 16 registers never hold taller tiles
    long_k = "torch.nn.Linear(5632, 256, bias=False)(torch.randn(128, 5632))"
    spr, avx2 = (tile_knobs(long_k, t) for t in ("cpu-spr", "cpu-avx2"))
    assert (spr["TILE_N"], spr["THREAD_M"], spr["K_CHUNK"], spr["PREFETCH"]) == (64, 6, 512, True)
    assert (avx2["TILE_N"], avx2["THREAD_M"]) == (16, 6)
    # an M-side operand computed in the tile (RMSNorm's output, PROLOGUE=fuse) is packed per tile
    # for all of K: no chunks, so two vectors and tall tiles
    rms = ("torch.nn.Sequential(torch.nn.RMSNorm(5632), torch.nn.Linear(5632, 256, bias=False))"
           "(torch.randn(128, 5632))")
    spr = tile_knobs(rms, "cpu-spr", PROLOGUE="fuse")
    assert "K_CHUNK" not in spr and (spr["TILE_N"], spr["THREAD_M"]) == (32, 8)


@pytest.mark.parametrize("m, thread_m", [(8, 4), (7, 4), (13, 5), (5, 5), (128, 6), (12, 6)])
def test_a_register_tile_fits_few_rows(m, thread_m):
    """8 rows (a decode step's GQA scores: 8 query heads a KV head) as 6 + 2 computed 12 rows;
    as 4 + 4 they compute 8. Heights above half the default only, and only where the default
    leaves over a fifth of the rows past M."""
    code = f"torch.randn(4, {m}, 64) @ torch.randn(4, 64, 160)"    # (a linear of few rows: FORM=dot)
    for target in ("cpu-spr", "cpu-avx2"):
        knobs = tile_knobs(code, target)
        assert (knobs["FORM"], knobs["THREAD_M"]) == ("outer", thread_m)


def test_a_tile_too_big_for_the_registers_stays_scalar():
    c = c_source(F32_LINEAR, "cpu-spr", TILE_N=64, THREAD_M=8)   # 32 accumulators + 5
    assert "_mm512_fmadd_ps" not in c and "_mm256_fmadd_ps" not in c
    assert "fmaf(" in c


def _bits(target: str, args):
    fn = lambda a, b: a @ b                                        # noqa: E731
    program = strata.compile(fn, args, device="cpu", ctx=Context(target=target))
    out = program(*args)
    return (out[0] if isinstance(out, (list, tuple)) else out).view(torch.int32)


@pytest.mark.skipif("avx2" not in host().features, reason="this CPU has no AVX2 to run cpu-avx2 code")
def test_every_vector_width_gives_the_scalar_loops_bits():
    """The same matmul (odd sizes, edge tiles) built for this CPU, for AVX2 and for baseline
    x86-64 (no vectors: the loop as written, fmaf) agrees bit for bit, and with eager."""
    torch.manual_seed(0)
    args = (torch.randn(37, 131), torch.randn(131, 70))
    scalar = _bits("cpu", args)
    torch.testing.assert_close(scalar.view(torch.float32), args[0] @ args[1], rtol=1e-5, atol=1e-5)
    for target in ("cpu-avx2", "host"):
        assert torch.equal(_bits(target, args), scalar), target


@pytest.mark.skipif(shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="needs qemu-user and gcc-aarch64-linux-gnu (apt-get install qemu-user "
                           "gcc-aarch64-linux-gnu)")
def test_neon_tiles_give_the_scalar_loops_bits():
    torch.manual_seed(1)
    args = (torch.randn(13, 64), torch.randn(64, 48))
    assert torch.equal(_bits("cpu-neoverse", args), _bits("cpu", args))


def test_the_host_target_has_this_cpus_caches():
    found = sysfs_caches()
    caches = dict(host().caches)
    if "L1d" in found and "L2" in found:
        assert caches == {"L1": found["L1d"], "L2": found["L2"]}
    else:
        assert host().caches == TARGETS["cpu"].caches
    assert host("flags : sse2 avx2\n").caches == TARGETS["cpu"].caches     # another machine's text


LINEAR_2048 = "torch.nn.Linear(2048, 256, bias=False)(torch.randn(128, 2048))"


def test_tiles_prefetch_the_next_blocks_packed_panel_where_two_fit_in_half_of_l2():
    c = c_source(LINEAR_2048, "cpu-spr")        # a 512 KiB panel, 2 MiB L2
    fetches = re.findall(r"__builtin_prefetch\(&(\w+)\[(.*?)\], 0, 2\);", c)
    assert fetches and {buf for buf, _ in fetches} == {"p_weight_panel"}
    assert all("mi % 4 * 16" in at and at.endswith("+ 131072") for _, at in fetches)   # the next panel
    assert "__builtin_prefetch" not in c_source(LINEAR_2048, "cpu-spr", PREFETCH=0)
    assert "__builtin_prefetch" not in c_source(LINEAR_2048, "cpu-spr", PACK="call")   # no next panel
    long_k = "torch.nn.Linear(5632, 256, bias=False)(torch.randn(128, 5632))"    # in K chunks:
    fetches = re.findall(r"__builtin_prefetch\(&(\w+)\[(.*?)\], 0, 2\);", c_source(long_k, "cpu-spr"))
    assert fetches and all(at.endswith("+ 32768") for _, at in fetches)     # the next 512 rows
    assert "__builtin_prefetch" not in c_source(long_k, "cpu-spr", K_CHUNK=0)   # 1.4 MiB panels
    assert "__builtin_prefetch" not in c_source(LINEAR_2048, "cpu-avx2")    # off with 6 x 2 tiles
    assert "__builtin_prefetch" in c_source(LINEAR_2048, "cpu-avx2", PREFETCH=1)


def test_prefetching_changes_no_value():
    torch.manual_seed(2)
    lin, x = torch.nn.Linear(2048, 40, bias=False), torch.randn(97, 2048)     # outer form, edges
    outs = []
    for on in (1, 0):
        program = strata.compile(lin, (x,), device="cpu", ctx=Context(knobs={"PREFETCH": on}))
        assert ("__builtin_prefetch" in program.source("c")) == (on == 1)   # (AVX2 too: 6 x 2)
        outs.append(program(x))
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0], lin(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k_chunk", [64, 192, 1000])      # a chunk not dividing K: a short last one
def test_k_chunks_give_the_same_bits(k_chunk):
    """K in chunks over all of a block's register tiles (their sums kept in a scratch between
    chunks, the next chunk's panel prefetched) adds the same products in the same order."""
    torch.manual_seed(3)
    lin, x = torch.nn.Linear(1100, 72), torch.randn(97, 1100)
    whole = strata.compile(lin, (x,), device="cpu", ctx=Context(knobs={"K_CHUNK": 0}))
    chunked = strata.compile(lin, (x,), device="cpu", ctx=Context(knobs={"K_CHUNK": k_chunk}))
    assert "for (int kc = 0;" in chunked.source("c") and "for (int kc = 0;" not in whole.source("c")
    assert torch.equal(chunked(x), whole(x))
    torch.testing.assert_close(chunked(x), lin(x), rtol=1e-5, atol=1e-5)


def test_f32_dot_form_takes_fewer_rows_with_16_vector_registers():
    """The dot form's 2 x 8 vector accumulators fill AVX2's 16 registers: from 25 rows the packed
    outer form runs there (tile/contraction.py DOT_MAX_M_16), up to 64 with AVX-512's 32."""
    linear = "torch.nn.functional.linear(torch.randn({}, 512), torch.randn(64, 512))"
    assert tile_knobs(linear.format(24), "cpu-avx2")["FORM"] == "dot"
    assert tile_knobs(linear.format(32), "cpu-avx2")["FORM"] == "outer"
    assert tile_knobs(linear.format(64), "cpu-znver4")["FORM"] == "dot"
