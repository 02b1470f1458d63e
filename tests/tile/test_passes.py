"""Tile passes: each does its job where it applies and says why where it declines."""
import torch

import strata
from strata.core.context import Context
from strata.pipeline import TILE_PASSES


def _tile(fn, *inputs, knobs=None, verbosity=0):
    ctx = Context(verbosity=verbosity, knobs=knobs or {})
    prog = strata.compile(fn, inputs, ctx=ctx)
    return prog, ctx


def test_rms_norm_schedule_matches_the_seed():
    prog, _ = _tile(torch.nn.RMSNorm(2048), torch.randn(1, 32, 2048))
    text = prog.ir("tile")
    assert "x_smem = Stage(x, origin=a0 * 2048, slab=2048, vec=4)" in text
    assert "StridedLoop(a1 = t * 4; < 2048; += 1024):  # reduce, unroll, vec=4" in text
    assert "acc0 = Combine(acc0:sum, threads=256)" in text
    (k,) = prog.kernels
    assert (k.grid, k.block) == (32, 256)
    cuda = prog.source("cuda")
    assert "__shfl_xor_sync" in cuda and "__launch_bounds__(256)" in cuda
    assert 'extern "C" __global__' in cuda and "k_rms_norm_reduce(" in cuda


def test_vectorize_applies_and_declines():
    prog, _ = _tile(lambda x: torch.sigmoid(x) * 2, torch.randn(8, 64))
    assert "VEC=4" in prog.ir("tile")
    assert "float4" in prog.source("cuda")
    prog, ctx = _tile(lambda x: torch.sigmoid(x) * 2, torch.randn(7, 33), verbosity=0)
    assert any("vectorize" in m and "declined" in m for m in ctx.messages)


def test_row_loops_vectorize_and_decline():
    prog, _ = _tile(torch.nn.RMSNorm(2048), torch.randn(3, 2048).to(torch.bfloat16))
    assert "StridedLoop(a1 = t * 8; < 2048; += 2048):  # reduce, unroll, vec=8" in prog.ir("tile")
    assert "uint4" in prog.source("cuda")
    prog, ctx = _tile(lambda x: x.sum(-1), torch.randn(4, 1001))
    assert "vec=" not in prog.ir("tile")
    assert any("vectorize" in m and "extent 1001 is not a multiple of 4" in m for m in ctx.messages)
    prog, ctx = _tile(lambda x: x.sum(-2), torch.randn(64, 256, 4))
    assert any("vectorize" in m and "not accessed contiguously" in m for m in ctx.messages)


def test_knob_pins_block_size():
    prog, _ = _tile(lambda x: x.exp(), torch.randn(5000), knobs={"BLOCK": "128", "VEC": "1"})
    (k,) = prog.kernels
    assert k.block == 128 and k.grid == 40


def test_short_rows_get_one_thread_each_and_say_why():
    prog, ctx = _tile(lambda x: x.sum(-1), torch.randn(100, 5))
    assert "GROUP=1" in prog.ir("tile")
    assert any("cooperative_reduce" in m and "too short" in m for m in ctx.messages)


def test_stage_declines_when_slab_exceeds_budget():
    prog, ctx = _tile(torch.nn.RMSNorm(4096), torch.randn(2, 4096), knobs={"SMEM_BUDGET": "1024"})
    assert "Stage(" not in prog.ir("tile")
    assert any("stage_inputs" in m and "budget" in m for m in ctx.messages)


def test_vv_prints_a_diff_per_pass_that_changed_something():
    prog, ctx = _tile(torch.nn.RMSNorm(2048), torch.randn(1, 32, 2048), verbosity=2)
    log = "\n".join(ctx.messages)
    changed = [f"t:{num:03d}_{name}" for num, (name, _) in enumerate(TILE_PASSES, start=1)
               if f">>> t:{num:03d}_{name}" in log]
    assert all(f"<<< {tag}" in log for tag in changed)
    assert f"{len(TILE_PASSES) - len(changed)} of {len(TILE_PASSES)} tile passes changed nothing" in log
    names = [n for n, _ in TILE_PASSES]
    assert {f"t:{names.index(n) + 1:03d}_{n}" for n in ("tileify", "cooperative_reduce",
                                                        "stage_inputs")} <= set(changed)
    tag = f"t:{[n for n, _ in TILE_PASSES].index('stage_inputs') + 1:03d}_stage_inputs"
    stage = log.split(f">>> {tag}")[1].split(f"<<< {tag}")[0]
    assert "+    x_smem = Stage(x" in stage and "-        in0 = load x[0, a0, a1]" in stage
