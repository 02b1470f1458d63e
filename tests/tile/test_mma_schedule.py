"""The tensor-core schedule (mma_tile, mma_swizzle, mma_async_copy, mma_pipeline; lower_mma):
fp16/bf16 contractions through the simulator against eager float64 at awkward shapes, the
matmul family with its fusions in one kernel, the knobs, the -vv diffs, the CUDA of a
4096^3 bf16 matmul, and that a broken fragment mapping or a missing cp.async wait is caught."""
import io
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import strata
from ir_rewrite import rewrite
from conftest import compile_with_nvrtc, run_and_compare
from strata.bench import check
from strata import pipeline
from strata.core.context import Context
from strata.core.errors import SimError
from strata.kernel_ir.ir import CpAsyncWait, Mma
from strata.kernel_ir.lower import lower
from strata.kernel_ir.verify import verify_program

r = torch.randn
BF16, F16 = torch.bfloat16, torch.float16


def _mma(prog) -> list:
    return [k for k in prog.lowered.tile.kernels if k.mode == "mma"]


def _one_mma_kernel(prog):
    assert len(prog.kernels) == 1 and len(_mma(prog)) == 1, prog.ir("tile")
    return _mma(prog)[0]


SHAPES = [(1, 7, 33), (7, 33, 257), (33, 257, 7), (257, 1, 33), (33, 33, 1), (257, 7, 7),
          (7, 257, 33), (1, 257, 257)]


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_mm_at_awkward_shapes(m, n, k, dtype):
    prog = run_and_compare(torch.mm, (r(m, k).to(dtype), r(k, n).to(dtype)), contraction=True)
    if m * n > 1:
        _one_mma_kernel(prog)


@pytest.mark.slow
def test_long_k():
    prog = run_and_compare(torch.mm, (r(7, 4097).to(BF16), r(4097, 33).to(BF16)), contraction=True,
                           ctx=Context(knobs={"SPLIT_K": "1"}))     # one K loop with a tail
    assert "a2 in 0..4097 by 32" in str(_one_mma_kernel(prog))


FAMILY = {
    "addmm": (lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0), (r(33), r(7, 33), r(33, 33))),
    "linear_bias": (F.linear, (r(2, 7, 32), r(257, 32), r(257))),
    "linear_nobias": (F.linear, (r(33, 7), r(33, 7))),
    "bmm": (torch.bmm, (r(3, 7, 33), r(3, 33, 7))),
    "matmul_broadcast": (torch.matmul, (r(2, 1, 7, 32), r(3, 32, 16))),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0),
                (r(3, 7, 1), r(3, 7, 33), r(3, 33, 7))),
    "vector_matrix": (torch.matmul, (r(33), r(33, 7))),
    "matrix_vector": (torch.matmul, (r(7, 33), r(33))),
    "transposed_a": (lambda x, w: x.t() @ w, (r(32, 7), r(32, 24))),
    "residual_epilogue": (lambda x, w, res: torch.sigmoid(x @ w) + res, (r(7, 33), r(33, 7), r(7, 7))),
    "scale_cast_epilogue": (lambda x, w: (0.5 * (x @ w)).float(), (r(7, 33), r(33, 7))),
    "bias_prologue": (lambda x, b, w: torch.relu((x + b) @ w), (r(7, 32), r(32), r(32, 8))),
    "mlp_silu_gate_up": (lambda x, g, u: F.silu(x @ g) * (x @ u), (r(7, 33), r(33, 16), r(33, 16))),
}


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("name", list(FAMILY))
def test_matmul_family_is_one_mma_kernel(name, dtype):
    fn, inputs = FAMILY[name]
    inputs = tuple(x.to(dtype) for x in inputs)
    _one_mma_kernel(run_and_compare(fn, inputs, contraction=True))


def test_fills_use_cp_async_where_aligned_and_plain_loads_elsewhere():
    ctx = Context()
    prog = run_and_compare(F.linear, (r(2, 7, 32).to(BF16), r(24, 32).to(BF16)), contraction=True, ctx=ctx)
    text = prog.ir("tile")
    assert text.count("fill=cp.async") == 2 and "K contiguous, fill=cp.async" in text
    assert prog.ir("kernel").count("cp.async.cg.16") == 2
    ctx = Context()      # N = 12: rows of w are not 16-byte aligned; a prologue is computed per element
    prog = run_and_compare(lambda x, b, w: (x + b) @ w, (r(7, 33).to(F16), r(33).to(F16), r(33, 12).to(F16)),
                           contraction=True, ctx=ctx)
    assert "fill=cp.async" not in prog.ir("tile") and "cp.async.cg" not in prog.ir("kernel")
    assert any("A of acc0 keeps plain loads, it computes a prologue" in m for m in ctx.messages)
    assert any("B of acc0 keeps plain loads, its contiguous extent 12" in m for m in ctx.messages)


def test_few_tiles_shrink_to_fill_the_gpu():
    """An M = 128 projection would be 44 blocks of 128x128 on a 132-SM GPU: 64x64 gives 176."""
    prog = strata.compile(F.linear, (r(128, 256).to(BF16), r(5632, 256).to(BF16)), ctx=Context())
    (k,) = prog.lowered.tile.kernels
    assert (k.matmul.tile_m, k.matmul.tile_n, k.grid) == (64, 64, 176), str(k)


def test_default_knobs_are_printed():
    prog = strata.compile(torch.mm, (r(2048, 256).to(BF16), r(256, 2048).to(BF16)), ctx=Context())
    (k,) = prog.lowered.tile.kernels
    text = str(k)
    assert ("kernel k_mm_reduce  # CP_ASYNC=1, INSTR=mma, STAGES=3, SWIZZLE=xor, TILE_K=32, "
            "TILE_M=128, TILE_N=128, WARPS_M=2, WARPS_N=4") in text
    assert ("Tile(mma=(a0:2048=M, a1:2048=N) = 128x128/BLOCK, warps:2x4 of 64x32 = 4x4 "
            "m16n8k16.bf16, grid=256, block=256):") in text
    assert "acc0 = MmaLoop(acc0:sum, a2 in 0..256 by 32, stages=3, smem=xor):" in text


KNOBS = [{"SWIZZLE": "pad", "STAGES": "2"}, {"SWIZZLE": "none", "STAGES": "1"},
         {"STAGES": "4", "TILE_K": "16", "TILE_M": "32", "TILE_N": "16", "WARPS_M": "2", "WARPS_N": "1"},
         {"CP_ASYNC": "0", "TILE_N": "24", "WARPS_N": "3"}]


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_pinned_knobs_stay_correct(knobs):
    prog = run_and_compare(torch.mm, (r(70, 96).to(F16), r(96, 40).to(F16)), contraction=True,
                           ctx=Context(knobs=knobs))
    text = str(_one_mma_kernel(prog))
    for name, value in knobs.items():
        assert f"{name}={value}" in text


def test_instr_and_target_choose_the_path():
    inputs = (r(33, 64).to(BF16), r(64, 33).to(BF16))
    prog = run_and_compare(torch.mm, inputs, contraction=True, ctx=Context(knobs={"INSTR": "fma"}))
    assert [k.mode for k in prog.lowered.tile.kernels] == ["matmul"]
    ctx = Context(target="sm_75")
    prog = strata.compile(torch.mm, inputs, ctx=ctx)
    assert [k.mode for k in prog.lowered.tile.kernels] == ["matmul"]
    assert any("sm_75 has no mma.sync" in m for m in ctx.messages)
    ctx = Context()      # fp32 keeps the CUDA-core path
    prog = strata.compile(torch.mm, (r(33, 64), r(64, 33)), ctx=ctx)
    assert [k.mode for k in prog.lowered.tile.kernels] == ["matmul"]
    assert any("mma_tile" in m and "not f16 or bf16" in m for m in ctx.messages)
    ctx = Context()      # an f32 result of a computed fp16 prologue: rounding it would not be eager
    strata.compile(lambda x, w: (x.float() * 1.001) @ w.float(), inputs, ctx=ctx)
    assert any("mma_tile" in m and "prologue computes in f32" in m for m in ctx.messages)
    for knobs, msg in (({"INSTR": "wmma"}, "INSTR=wmma"), ({"WARPS_M": "3"}, "WARPS_M=3"),
                       ({"TILE_K": "24"}, "TILE_K=24"), ({"SWIZZLE": "zigzag"}, "SWIZZLE=zigzag"),
                       ({"STAGES": "9"}, "STAGES=9")):
        with pytest.raises(ValueError, match=msg):
            strata.compile(torch.mm, inputs, ctx=Context(knobs=knobs))


def test_split_k_for_decode_shapes():
    ctx = Context()
    prog = run_and_compare(lambda x, w, b: F.linear(x, w, b),
                           (r(1, 2048).to(BF16), r(64, 2048).to(BF16), r(64).to(BF16)),
                           contraction=True, ctx=ctx)
    first, second = prog.lowered.tile.kernels
    assert first.name.endswith("_splitk") and first.mode == "mma" and "SPLIT_K=32" in str(first)
    assert "TILE_M=16" in str(first)
    prog = run_and_compare(torch.mm, (r(16, 1024).to(F16), r(1024, 48).to(F16)), contraction=True,
                           ctx=Context(knobs={"SPLIT_K": "4"}))
    assert [k.mode for k in prog.lowered.tile.kernels][0] == "mma" and len(prog.kernels) == 2


def test_decode_gemvs_keep_more_weight_bytes_in_flight():
    """At most 16 rows of M: the deepest pipeline that fits, up to 8 stages and the K steps
    (28 KB of weight in flight a block; 3 stages read at 18% of an H200's bandwidth), still eager's
    numbers; a 64-row product keeps 3 stages."""
    for m, k, n, want in ((1, 2048, 96, 8), (3, 224, 40, 7), (16, 96, 64, 3)):
        prog = run_and_compare(torch.mm, (r(m, k).to(BF16), r(k, n).to(BF16)), contraction=True,
                               ctx=Context(knobs={"SPLIT_K": "1"}))
        assert f"STAGES={want}," in str(_one_mma_kernel(prog)), (m, k, n)
    prog = strata.compile(torch.mm, (r(64, 2048).to(BF16), r(2048, 96).to(BF16)), ctx=Context())
    assert "STAGES=3," in str(_mma(prog)[0])


def test_vv_diffs_show_each_mma_pass():
    ctx = Context(verbosity=2, stream=io.StringIO())
    strata.compile(torch.mm, (r(64, 128).to(F16), r(128, 96).to(F16)), ctx=ctx)
    log = "\n".join(ctx.messages)
    num = {n: i for i, (n, _) in enumerate(pipeline.TILE_PASSES, start=1)}

    def diff(name):
        tag = f"t:{num[name]:03d}_{name}"
        return log.split(f">>> {tag}")[1].split(f"<<< {tag}")[0]
    assert "+Tile(mma=(a0:64=M, a1:96=N) = 64x64/BLOCK, warps:1x4" in diff("mma_tile")
    assert "+    acc0 = MmaLoop(acc0:sum, a2 in 0..128 by 32, stages=1, smem=none):" in diff("mma_tile")
    assert "smem=xor" in diff("mma_swizzle") and "SWIZZLE=xor" in diff("mma_swizzle")
    assert "+        A = in2[a0 - m0, a2]  # K contiguous, fill=cp.async" in diff("mma_async_copy")
    assert "+        B = in3[a2, a1 - n0]  # X contiguous, fill=cp.async" in diff("mma_async_copy")
    assert "stages=3" in diff("mma_pipeline") and "STAGES=3" in diff("mma_pipeline")


def test_every_mma_pass_leaves_a_runnable_schedule(monkeypatch):
    inputs = (r(40, 64).to(BF16), r(64, 24).to(BF16))
    prog = strata.compile(torch.mm, inputs, ctx=Context())
    want = check.eager_reference(torch.mm, inputs)[0]
    names = [n for n, _ in pipeline.TILE_PASSES]
    for last in ("mma_tile", "mma_swizzle", "mma_async_copy"):
        monkeypatch.setattr(pipeline, "TILE_PASSES", pipeline.TILE_PASSES[:names.index(last) + 1])
        prog.lowered.kernel = lower(pipeline.run_tile_passes(prog.lowered.loop, Context()))
        verify_program(prog.lowered.kernel)
        assert "mma.m16n8k16" in str(prog.lowered.kernel)
        got = prog.run_numpy(inputs)[0]
        assert check.compare("mm", "bf16", got, want, check.tolerance("bf16", True)).passed


def test_bf16_4096_cuda_uses_tensor_cores():
    a, b = r(4096, 4096).to(BF16), r(4096, 4096).to(BF16)
    prog = strata.compile(torch.mm, (a, b), ctx=Context(target="sm_80"))
    cuda = prog.source("cuda")
    for needle in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "ldmatrix.sync.aligned",
                   "cp.async.cg.shared.global", "cp.async.wait_group 1", "__shared__"):
        assert needle in cuda
    compile_with_nvrtc(prog)            # sm_80 and sm_90


# ---------------------------------------------------------------- broken schedules fail



def _swap_a(s):
    return replace(s, a=(s.a[0], s.a[2], s.a[1], s.a[3])) if isinstance(s, Mma) else s


def test_wrong_fragment_mapping_gives_wrong_numbers():
    inputs = (r(33, 64).to(F16), r(64, 40).to(F16))
    prog = strata.compile(torch.mm, inputs, ctx=Context())
    ref = check.eager_reference(torch.mm, inputs)[0]
    prog.lowered.kernel = rewrite(prog.lowered.kernel, _swap_a)
    got = np.asarray(prog.run_numpy(inputs)[0], np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) > 0.1


def test_missing_cp_async_wait_is_caught():
    inputs = (r(33, 64).to(F16), r(64, 40).to(F16))
    prog = strata.compile(torch.mm, inputs, ctx=Context())
    prog.lowered.kernel = rewrite(prog.lowered.kernel, lambda s: None if isinstance(s, CpAsyncWait) else s)
    with pytest.raises(SimError, match="missing cp.async.wait_group"):
        prog.run_numpy(inputs)
