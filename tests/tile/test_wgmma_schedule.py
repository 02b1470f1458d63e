"""The Hopper schedule (wgmma_tile, wgmma_pipeline; kernel_ir/lower_wgmma.py): on --target sm_90a,
fp16/bf16 contractions run as TMA + mbarrier pipelines feeding wgmma (operands K-major, or
MN-major read with the transpose bits).
Through the simulator against eager float64 at awkward shapes (edges zero-filled by TMA), the
fused epilogues in one kernel, the declines (with their reasons) to mma.sync, the knobs, the
CUDA of a 4096^3 bf16 matmul compiled by NVRTC for sm_90a, and broken pipelines caught."""
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import strata
from ir_rewrite import rewrite
from strata.bench import check
from strata import pipeline
from strata.core.context import Context
from strata.core.errors import SimError
from strata.kernel_ir.ir import (
    MbarWait,
    Smem,
    Wgmma,
    WgmmaWait,
    walk,
)
from strata.kernel_ir.verify import KernelVerifyError, verify_program, verify_kernel

nvrtc = pytest.importorskip("strata.runtime.nvrtc")

r = torch.randn
BF16, F16 = torch.bfloat16, torch.float16
SM90A = "sm_90a"


def _compile(fn, inputs, knobs=None, target=SM90A, until="cuda"):
    return strata.compile(fn, inputs, ctx=Context(target=target, knobs=knobs or {}), until=until)


def _check(prog, fn, inputs):
    """Every output of the simulated kernels matches eager float64 (docs/design.md tolerances)."""
    got = prog.run_numpy(inputs)
    ref = check.eager_reference(fn, inputs)
    for name, g, want in zip(prog.lowered.kernel.outputs, got, ref):
        dt = prog.lowered.kernel.buffer(name).dtype
        res = check.compare(name, dt, g, want, check.tolerance(dt, True))
        assert res.passed, f"{name}: rel err {res.rel:.3g}, max abs {res.max_abs:.3g} (tol {res.tol})"


def run_wgmma(fn, inputs, knobs=None):
    """Compile for sm_90a, expect one wgmma kernel, verify it, build its PTX with NVRTC, and
    compare the simulated result with eager. Returns the program."""
    prog = _compile(fn, inputs, knobs)
    kinds = [k.mode for k in prog.lowered.tile.kernels]
    assert kinds == ["wgmma"], prog.ir("tile")
    verify_program(prog.lowered.kernel)
    ptx = nvrtc.compile_cuda(prog.source("cuda"), SM90A, want="ptx").decode()
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    _check(prog, fn, inputs)
    return prog


def linear_t(x, w):
    return x @ w.t()                     # w stored (N, K): K-major, like F.linear


SHAPES = [(2, 7, 40), (7, 33, 8), (33, 257, 72), (257, 9, 16), (70, 24, 200), (7, 257, 264)]


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("m,n,k", SHAPES, ids=str)
def test_linear_at_awkward_shapes(m, n, k, dtype):
    run_wgmma(F.linear, (r(m, k).to(dtype), r(n, k).to(dtype)))


@pytest.mark.parametrize("m,n,k", [(33, 7, 24), (65, 40, 136)], ids=str)
def test_mm_with_a_transposed_weight(m, n, k):
    run_wgmma(linear_t, (r(m, k).to(BF16), r(n, k).to(BF16)))


MM_SHAPES = [(2, 8, 40), (33, 72, 24), (70, 136, 200), (129, 16, 8)]


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("m,n,k", MM_SHAPES, ids=str)
def test_mm_with_b_stored_k_by_n_reads_b_n_major(m, n, k, dtype):
    """torch.mm(a, b), b (K, N) N-contiguous: B comes by TMA in boxes of 64 N by TILE_K and
    wgmma reads it with imm-trans-b = 1 (N past the edge zero-filled)."""
    prog = run_wgmma(torch.mm, (r(m, k).to(dtype), r(k, n).to(dtype)))
    assert "a1 - n0]  # X contiguous, fill=tma" in prog.ir("tile")   # B: N contiguous
    wg = [s for s in walk(prog.lowered.kernel.kernels[0].body) if isinstance(s, Wgmma)]
    assert wg and all(s.trans_b and not s.trans_a for s in wg)
    assert ", p, 1, 1, 0, 1; }" in prog.source("cuda")


def test_mm_with_a_transposed_reads_a_m_major():
    """a.t() @ b with a stored (K, M): both operands MN-major (imm-trans-a = imm-trans-b = 1),
    two warpgroups each reading its own 64-row run of A."""
    prog = run_wgmma(lambda a, b: a.t() @ b, (r(72, 136).to(BF16), r(72, 64).to(BF16)))
    wg = [s for s in walk(prog.lowered.kernel.kernels[0].body) if isinstance(s, Wgmma)]
    assert wg and all(s.trans_a and s.trans_b for s in wg)


def test_bmm_with_b_stored_k_by_n():
    run_wgmma(torch.bmm, (r(3, 7, 40).to(BF16), r(3, 40, 64).to(BF16)))


def test_n_major_b_takes_tile_n_a_multiple_of_64():
    inputs = (r(70, 96).to(F16), r(96, 136).to(F16))
    prog = run_wgmma(torch.mm, inputs, {"TILE_N": "64", "STAGES": "2", "TILE_K": "32"})
    assert "TILE_N=64" in prog.ir("tile")
    ctx = Context(target=SM90A, knobs={"TILE_N": "32"})
    prog = strata.compile(torch.mm, inputs, ctx=ctx, until="tile")
    assert [k.mode for k in prog.lowered.tile.kernels] == ["mma"]
    assert any("N-major B" in m and "multiple of 64" in m for m in ctx.messages), ctx.messages


FAMILY = {
    "linear_bias": (F.linear, (r(2, 7, 32), r(257, 32), r(257))),
    "bmm_kmajor": (lambda a, b: torch.bmm(a, b.transpose(1, 2)), (r(3, 7, 40), r(3, 33, 40))),
    "residual_sigmoid": (lambda x, w, res: torch.sigmoid(F.linear(x, w)) + res,
                         (r(7, 48), r(33, 48), r(7, 33))),
    "scale_cast": (lambda x, w: (0.5 * F.linear(x, w)).float(), (r(9, 32), r(20, 32))),
    "mlp_silu_gate_up": (lambda x, g, u: F.silu(F.linear(x, g)) * F.linear(x, u),
                         (r(7, 72), r(24, 72), r(24, 72))),
}


@pytest.mark.parametrize("name", list(FAMILY))
def test_fused_epilogues_are_one_wgmma_kernel(name):
    fn, inputs = FAMILY[name]
    inputs = tuple(x.to(BF16) for x in inputs)
    prog = run_wgmma(fn, inputs)
    assert len(prog.kernels) == 1


def test_default_knobs_are_printed_and_pins_hold():
    prog = _compile(F.linear, (r(512, 256).to(BF16), r(384, 256).to(BF16)), until="tile")
    text = prog.ir("tile")
    assert ("kernel k_linear_reduce  # INSTR=wgmma, STAGES=4, TILE_K=64, TILE_M=128, TILE_N=128, "
            "WARPGROUPS=2") in text
    assert ("Tile(wgmma=(a0:512=M, a1:384=N) = 128x128/BLOCK, warpgroups:2 of 64x128 = "
            "m64n128k16.bf16, grid=12, block=256):") in text
    assert "acc0 = MmaLoop(acc0:sum, a2 in 0..256 by 64, stages=4, smem=128B):" in text
    assert "B = in3[a1 - n0, a2]  # K contiguous, fill=tma" in text


KNOBS = [{"TILE_N": "24", "STAGES": "2"}, {"TILE_K": "32", "STAGES": "3", "TILE_N": "16"},
         {"TILE_K": "16", "STAGES": "1"}, {"WARPGROUPS": "2", "TILE_N": "40"}]


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_pinned_knobs_stay_correct(knobs):
    prog = run_wgmma(F.linear, (r(70, 96).to(F16), r(40, 96).to(F16)), knobs)
    text = prog.ir("tile")
    for name, value in knobs.items():
        assert f"{name}={value}" in text


def test_bad_knobs_are_refused():
    inputs = (r(33, 64).to(BF16), r(40, 64).to(BF16))
    for knobs, msg in (({"INSTR": "wmma"}, "INSTR=wmma"), ({"TILE_M": "96"}, "TILE_M=96"),
                       ({"TILE_N": "12"}, "TILE_N=12"), ({"TILE_K": "128"}, "TILE_K=128"),
                       ({"STAGES": "20"}, "STAGES=20")):
        with pytest.raises(ValueError, match=msg):
            _compile(F.linear, inputs, knobs, until="tile")


DECLINES = [
    ("a prologue", lambda x, b, w: F.linear(x + b, w), (r(7, 32), r(32), r(16, 32)),
     "computes a prologue"),
    ("K = 33", F.linear, (r(7, 33), r(16, 33)), "not a multiple of 16 bytes"),
    ("one row (decode)", F.linear, (r(1, 32), r(16, 32)), "M side is a vector"),
    ("x @ w, w stored (K, N) with N = 36", torch.mm, (r(7, 32), r(32, 36)),
     "not a multiple of 16 bytes"),
]


@pytest.mark.parametrize("what,fn,inputs,why", DECLINES, ids=[d[0] for d in DECLINES])
def test_declines_say_why_and_take_mma_sync(what, fn, inputs, why):
    inputs = tuple(x.to(BF16) for x in inputs)
    ctx = Context(target=SM90A)
    prog = strata.compile(fn, inputs, ctx=ctx)
    assert "mma" in [k.mode for k in prog.lowered.tile.kernels], prog.ir("tile")
    assert any(m.startswith("wgmma_tile:") and why in m for m in ctx.messages), ctx.messages
    _check(prog, fn, inputs)
    with pytest.raises(ValueError, match="INSTR=wgmma"):
        _compile(fn, inputs, {"INSTR": "wgmma"}, until="tile")


def test_only_sm90a_takes_wgmma():
    inputs = (r(33, 64).to(BF16), r(40, 64).to(BF16))
    for target, why in (("sm_90", "sm_90 has no wgmma (needs sm_90a)"), ("sm_80", "sm_80 has no")):
        ctx = Context(target=target)
        prog = strata.compile(F.linear, inputs, ctx=ctx, until="tile")
        assert [k.mode for k in prog.lowered.tile.kernels] == ["mma"]
        assert any(why in m for m in ctx.messages)
    ctx = Context(target=SM90A, knobs={"INSTR": "mma"})
    prog = strata.compile(F.linear, inputs, ctx=ctx, until="tile")
    assert [k.mode for k in prog.lowered.tile.kernels] == ["mma"]


def test_vv_diffs_show_both_passes():
    ctx = Context(target=SM90A, verbosity=2, stream=__import__("io").StringIO())
    strata.compile(F.linear, (r(64, 128).to(F16), r(96, 128).to(F16)), ctx=ctx, until="tile")
    log = "\n".join(ctx.messages)
    num = {n: i for i, (n, _) in enumerate(pipeline.TILE_PASSES, start=1)}

    def diff(name):
        tag = f"t:{num[name]:03d}_{name}"
        return log.split(f">>> {tag}")[1].split(f"<<< {tag}")[0]
    assert "+Tile(wgmma=(a0:64=M, a1:96=N) = 64x96/BLOCK, warpgroups:1" in diff("wgmma_tile")
    assert "stages=2" in diff("wgmma_pipeline") and "STAGES=2" in diff("wgmma_pipeline")


# ---------------------------------------------------------------- the 4096^3 matmul

def test_bf16_4096_cuda_uses_wgmma_and_tma_on_sm90a_and_mma_on_sm80():
    x, w = r(4096, 4096).to(BF16), r(4096, 4096).to(BF16)
    prog = _compile(F.linear, (x, w))
    (k,) = prog.lowered.kernel.kernels
    assert k.dynamic_smem_bytes > 48 * 1024 and k.static_smem_bytes <= 48 * 1024
    cuda = prog.source("cuda")
    for needle in ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
                   "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "mbarrier.arrive.expect_tx", "const __grid_constant__ st_tensor_map",
                   "extern __shared__ __align__(1024) unsigned char st_dyn_smem_raw[];"):
        assert needle in cuda, needle
    assert "mma.sync.aligned" not in cuda
    assert nvrtc.compile_cuda(cuda, SM90A)[:4] == b"\x7fELF"       # ptxas assembles the PTX
    for fn, inputs in ((F.linear, (x, w)), (torch.mm, (x, w))):
        cuda80 = _compile(fn, inputs, target="sm_80").source("cuda")
        assert "mma.sync.aligned.m16n8k16" in cuda80 and "wgmma.mma_async" not in cuda80
        assert nvrtc.compile_cuda(cuda80, "sm_80", want="ptx")[:1]
    # x @ w with w stored (K, N): B N-major, read with imm-trans-b = 1, two boxes of 64 N per K step
    prog = _compile(torch.mm, (x, w))
    cuda = prog.source("cuda")
    for needle in ("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
                   ", p, 1, 1, 0, 1; }",
                   "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"):
        assert needle in cuda, needle
    assert "mma.sync.aligned" not in cuda
    maps = [p.tensor_map for p in prog.lowered.kernel.kernels[0].params if p.tensor_map]
    # A: K-major boxes of 64 K x 128 M; B: N-major boxes of 64 N x 64 K; rows 8192 bytes apart
    assert sorted(tm.box for tm in maps) == [(64, 64), (64, 128)]
    assert all(tm.swizzle == "128B" and tm.strides == (4096 * 2,) for tm in maps)
    assert nvrtc.compile_cuda(cuda, SM90A)[:4] == b"\x7fELF"


def test_dynamic_smem_limit_is_verified():
    prog = _compile(F.linear, (r(256, 128).to(BF16), r(256, 128).to(BF16)),
                    {"TILE_N": "256", "STAGES": "2"})
    (k,) = prog.lowered.kernel.kernels
    assert k.dynamic_smem_bytes == 1024 + 2 * (128 + 256) * 64 * 2
    big = [replace(s, size=s.size * 4) if isinstance(s, Smem) and s.dynamic else s for s in k.body]
    with pytest.raises(KernelVerifyError, match="static \\+ dynamic shared memory"):
        verify_kernel(replace(k, body=tuple(big)))
    static = [replace(s, dynamic=False) if isinstance(s, Smem) else s for s in k.body]
    with pytest.raises(KernelVerifyError, match="bytes of shared memory > 49152"):
        verify_kernel(replace(k, body=tuple(static)))


# ---------------------------------------------------------------- broken pipelines fail



def _pipelined():
    inputs = (r(40, 256).to(F16), r(24, 256).to(F16))      # 4 K steps over 2 stages: refills
    prog = _compile(F.linear, inputs, {"STAGES": "2"})
    assert [k.mode for k in prog.lowered.tile.kernels] == ["wgmma"]
    _check(prog, F.linear, inputs)
    return prog, inputs


def test_waiting_on_the_wrong_phase_is_caught():
    from strata.core.expr import Const, add, mod
    prog, inputs = _pipelined()
    flip = lambda s: replace(s, parity=mod(add(s.parity, Const(1, "i32")), 2)) \
        if isinstance(s, MbarWait) else s
    prog.lowered.kernel = rewrite(prog.lowered.kernel, flip)
    with pytest.raises(SimError, match="waits on mbarrier bar0.* parity 1, which has not completed"):
        prog.run_numpy(inputs)


def test_refilling_a_buffer_wgmma_still_reads_is_caught():
    prog, inputs = _pipelined()
    early = lambda s: replace(s, pending=2) if isinstance(s, WgmmaWait) and s.pending == 1 else s
    prog.lowered.kernel = rewrite(prog.lowered.kernel, early)
    with pytest.raises(SimError, match="missing wgmma.wait_group"):
        prog.run_numpy(inputs)


def test_wrong_accumulator_mapping_gives_wrong_numbers():
    prog, inputs = _pipelined()
    ref = check.eager_reference(F.linear, inputs)[0]

    def swap(s):
        return replace(s, d=(s.d[1], s.d[0]) + s.d[2:]) if isinstance(s, Wgmma) else s
    prog.lowered.kernel = rewrite(prog.lowered.kernel, swap)
    got = np.asarray(prog.run_numpy(inputs)[0], np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) > 0.05
