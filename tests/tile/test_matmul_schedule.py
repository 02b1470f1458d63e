"""The contraction schedule (tile_matmul ... pad_smem, split_matmul_k): the matmul family at
awkward shapes through the simulator, what each pass prints, knobs, and that the sanitizer
catches a broken schedule."""
import io
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import strata
from conftest import run_and_compare
from strata import pipeline
from strata.core.context import Context
from strata.core.errors import SimError
from strata.kernel_ir.lower import lower
from strata.tile.ir import Sync, TileProgram, map_body
from strata.kernel_ir.verify import verify_program

r = torch.randn


def seed_example(x, b, w):
    return torch.relu(torch.matmul(x + b, w))


def _tiled(prog) -> bool:
    return all("StageTile(" in str(k) for k in prog.lowered.tile.kernels if k.mode == "matmul") \
        and any(k.mode == "matmul" for k in prog.lowered.tile.kernels)


@pytest.mark.parametrize("m,n,k", [(33, 257, 7), (257, 33, 33), (7, 7, 257), (1, 257, 33),
                                   (257, 1, 7), (7, 1, 1), (1, 1, 33)], ids=str)
def test_mm_at_awkward_shapes(m, n, k):
    prog = run_and_compare(torch.mm, (r(m, k), r(k, n)), contraction=True)
    assert len(prog.kernels) == 1
    assert _tiled(prog) == (m * n > 1 and k > 1)     # a dot product stays a row reduction,
                                                    # an outer product is elementwise


FAMILY = {
    "addmm": (lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0), (r(33), r(7, 33), r(33, 33))),
    "linear_bias": (F.linear, (r(2, 7, 33), r(257, 33), r(257))),
    "linear_nobias": (F.linear, (r(33, 7), r(33, 7))),
    "bmm": (torch.bmm, (r(3, 7, 33), r(3, 33, 7))),
    "matmul_broadcast": (torch.matmul, (r(2, 1, 7, 33), r(3, 33, 7))),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
                (r(3, 7, 1), r(3, 7, 33), r(3, 33, 7))),
    "vector_matrix": (torch.matmul, (r(33), r(33, 7))),
    "matrix_vector": (torch.matmul, (r(7, 33), r(33))),
    "transposed_a": (lambda x, w: x.t() @ w, (r(33, 7), r(33, 7))),
    "residual_epilogue": (lambda x, w, res: torch.sigmoid(x @ w) + res, (r(7, 33), r(33, 7), r(7, 7))),
    "row_scale_prologue": (lambda x, s, w: (x * s[:, None]) @ w, (r(7, 33), r(7), r(33, 7))),
    "gather_prologue": (lambda ids, e, w: e[ids] @ w, (torch.randint(0, 9, (7,)), r(9, 33), r(33, 7))),
    "mlp_silu_gate_up": (lambda x, g, u: F.silu(x @ g) * (x @ u), (r(7, 33), r(33, 7), r(33, 7))),
}


@pytest.mark.parametrize("name", list(FAMILY))
def test_matmul_family(name):
    fn, inputs = FAMILY[name]
    prog = run_and_compare(fn, inputs, contraction=True)
    assert len(prog.kernels) == 1 and _tiled(prog), prog.ir("tile")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_inputs_accumulate_in_fp32(dtype):
    # the CUDA-core path (INSTR=fma); tensor cores are tests/tile/test_mma_schedule.py
    prog = run_and_compare(seed_example, (r(33, 7).to(dtype), r(7).to(dtype), r(7, 257).to(dtype)),
                           contraction=True, ctx=Context(knobs={"INSTR": "fma"}))
    assert _tiled(prog)
    assert "acc0_0_0 = 0.0  : f32" in prog.ir("kernel")
    run_and_compare(lambda x, w: (x @ w).float(), (r(7, 33).to(dtype), r(33, 7).to(dtype)),
                    contraction=True)


def test_seed_example_is_one_tiled_kernel():
    prog = run_and_compare(seed_example, (r(64, 128), r(128), r(128, 96)), contraction=True)
    assert len(prog.kernels) == 1
    text = prog.ir("tile")
    header = "PAD_A=2, PAD_B=0, THREAD_M=4, THREAD_N=4, TILE_K=16, TILE_M=64, TILE_N=64"
    assert f"kernel k_relu_reduce  # {header}" in text
    assert "Tile(matmul=(a0:64=M, a1:96=N) = 64x64/BLOCK, t:16x16=THREAD, grid=2, block=256):" in text
    assert "acc0 = Registers(acc0:sum, 4x4)" in text
    # the prologue is computed in the fill, once per element, not in the K-inner loop
    stage, compute = text.split("for a2_i in 0..16:")
    assert "v0 = add(in0, in1)" in stage and "add(in0" not in compute
    assert "v0_smem = StageTile(v0[a2_i:16, a0 - m0:64], stride=66, k fastest):" in stage
    assert "v0 = load v0_smem[a2_i, a0 - m0]" in compute
    assert "if a1 < 96:" in compute and "v2 = relu(acc0)" in compute
    cuda = prog.source("cuda")
    assert "__shared__ float v0_smem[1056];" in cuda and cuda.count("__syncthreads()") == 2
    assert "acc0_3_3 += v1_3_3;" in cuda


def test_every_pass_leaves_a_runnable_schedule(monkeypatch):
    """Lower and simulate the seed after each matmul pass: every intermediate Tile IR is valid."""
    inputs = (r(70, 40), r(40), r(40, 33))
    prog = strata.compile(seed_example, inputs, ctx=Context())
    want = prog.run_numpy(inputs)[0]
    names = [n for n, _ in pipeline.TILE_PASSES]
    for last in ("tile_matmul", "register_tile", "chunk_matmul_k", "stage_matmul_tiles"):
        monkeypatch.setattr(pipeline, "TILE_PASSES", pipeline.TILE_PASSES[:names.index(last) + 1])
        prog.lowered.kernel = lower(pipeline.run_tile_passes(prog.lowered.loop, Context()))
        verify_program(prog.lowered.kernel)
        torch.testing.assert_close(prog.run_numpy(inputs)[0], want, rtol=1e-5, atol=1e-5)


def test_knobs_pin_the_tile():
    knobs = {"TILE_M": "32", "TILE_N": "16", "THREAD_M": "2", "THREAD_N": "1", "TILE_K": "8",
             "PAD_A": "1", "PAD_B": "3"}
    prog = run_and_compare(seed_example, (r(33, 7), r(7), r(7, 257)), contraction=True,
                           ctx=Context(knobs=knobs))
    (k,) = prog.lowered.tile.kernels
    assert "PAD_A=1, PAD_B=3, THREAD_M=2, THREAD_N=1, TILE_K=8, TILE_M=32, TILE_N=16" in str(k)
    assert (k.grid, k.block) == (2 * 17, 16 * 16)
    assert "stride=33" in str(k) and "stride=19" in str(k)
    with pytest.raises(ValueError, match="THREAD_M=3"):
        strata.compile(seed_example, (r(33, 7), r(7), r(7, 257)), ctx=Context(knobs={"THREAD_M": "3"}))


def test_passes_say_why_they_decline():
    ctx = Context(knobs={"SMEM_BUDGET": "1024"})
    prog = run_and_compare(seed_example, (r(33, 7), r(7), r(7, 33)), contraction=True, ctx=ctx)
    assert "StageTile(" not in prog.ir("tile") and "Registers(" in prog.ir("tile")
    assert any("stage_matmul_tiles" in m and "SMEM_BUDGET=1024" in m for m in ctx.messages)
    ctx = Context()
    prog = run_and_compare(lambda x, w: x @ w, (torch.randint(-3, 3, (7, 33)), torch.randint(-3, 3, (33, 7))),
                           ctx=ctx)
    assert "matmul=" not in prog.ir("tile")
    assert any("tile_matmul" in m and "not one floating-point sum" in m for m in ctx.messages)
    ctx = Context()
    run_and_compare(lambda x, y: x @ y, (r(33), r(33)), ctx=ctx, contraction=True)
    assert any("tile_matmul" in m and "dot product" in m for m in ctx.messages)


def test_vv_diffs_show_each_matmul_pass():
    ctx = Context(verbosity=2, stream=io.StringIO())
    strata.compile(seed_example, (r(64, 128), r(128), r(128, 96)), ctx=ctx)
    log = "\n".join(ctx.messages)
    num = {n: i for i, (n, _) in enumerate(pipeline.TILE_PASSES, start=1)}

    def diff(name):
        tag = f"t:{num[name]:03d}_{name}"
        return log.split(f">>> {tag}")[1].split(f"<<< {tag}")[0]
    assert "+    Points(a0 = m0 + tm + 16 * i, a1 = n0 + tn + 16 * j; 4x4):" in diff("tile_matmul")
    assert "+    acc0 = Registers(acc0:sum, 4x4)" in diff("register_tile")
    assert "+    for a2_o in 0..8:  # reduce" in diff("chunk_matmul_k")
    assert "+        v0_smem = StageTile(" in diff("stage_matmul_tiles")
    assert "+        Sync" in diff("stage_matmul_tiles")
    assert "stride=66" in diff("pad_smem")
    assert "16-way -> 1-way bank conflicts" in log


def test_split_k_for_decode_shapes():
    ctx = Context()
    prog = run_and_compare(lambda x, w, b: F.linear(x, w, b), (r(1, 2048), r(64, 2048), r(64)),
                           contraction=True, ctx=ctx)
    first, _ = prog.lowered.tile.kernels
    assert first.name.endswith("_splitk") and first.mode == "matmul" and "SPLIT_K=32" in str(first)
    assert "k_linear_reduce_partial[a1_s, a0] = acc0" in str(first)      # one row: slices of 64
    assert any("split_matmul_k" in m and "split 32 ways" in m for m in ctx.messages)
    prog = run_and_compare(seed_example, (r(7, 99), r(99), r(99, 33)), contraction=True,
                           ctx=Context(knobs={"SPLIT_K": "3"}))
    assert len(prog.kernels) == 2
    ctx = Context()
    run_and_compare(torch.mm, (r(1, 127), r(127, 7)), contraction=True, ctx=ctx)
    assert any("split_matmul_k" in m and "too short" in m for m in ctx.messages)
    ctx = Context()
    run_and_compare(torch.mm, (r(1, 257), r(257, 7)), contraction=True, ctx=ctx)
    assert any("split_matmul_k" in m and "no divisor" in m for m in ctx.messages)
    with pytest.raises(ValueError, match="SPLIT_K=2"):
        strata.compile(torch.mm, (r(1, 257), r(257, 7)), ctx=Context(knobs={"SPLIT_K": "2"}))


def test_sanitizer_catches_a_missing_barrier():
    """Drop the barrier that ends each K step: the next fill overwrites a tile other threads
    are still reading, and the simulator says so."""
    inputs = (r(33, 40), r(40), r(40, 33))
    prog = strata.compile(seed_example, inputs, ctx=Context())
    tile = prog.lowered.tile
    broken = [replace(k, body=map_body(k.body, lambda s: () if isinstance(s, Sync) else s))
              for k in tile.kernels]
    prog.lowered.kernel = lower(TileProgram(broken, tile.loop_program))
    with pytest.raises(SimError, match="shared-memory race.*missing Sync"):
        prog.run_numpy(inputs)
