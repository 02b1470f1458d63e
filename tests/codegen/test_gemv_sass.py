"""Decode GEMVs at the memory limit, checked in the machine code without a GPU (issue 53 item 3).

Why: whether a GEMV reads its weights with 16-byte loads and spills nothing is decided by ptxas,
so these tests read NVRTC's cubin through `cuobjdump -sass` (runtime/sass.py) and ptxas -v for
TinyLlama-shaped projections at M = 1 and 16, bf16 and fp16, on sm_90a: every global load of the
K-split kernel is 128 bits (cp.async's LDGSTS.128) or TMA (UTMALDG), no spill bytes, one tile
along M (each weight byte is read by one block), and K split until the grid fills the SMs or
the slices reach their shortest. Q8_0/Q4_0 weights at M = 1 (tile/gemv.py): every global load
of the GEMV 128 bits, quants, scales and activations. The numbers still match eager on the
simulator.
"""
import pytest
import torch

from conftest import skip_unless_sass_readable

skip_unless_sass_readable()

import strata  # noqa: E402
from strata.bench import check  # noqa: E402
from strata.core.context import Context  # noqa: E402
from strata.runtime.nvrtc import resource_usage  # noqa: E402
from strata.runtime.sass import global_loads, prefetches_before_wait, sass  # noqa: E402
from strata.tile.passes.split_matmul_k import GEMV_K_MIN, K_MIN  # noqa: E402

ARCH = "sm_90a"
PROJECTIONS = [(2048, 2048), (2048, 256), (2048, 5632), (5632, 2048)]     # (K, N), TinyLlama's
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _compile(layer, x):
    with torch.no_grad():
        return strata.compile(layer.eval(), (x,), device="sim", ctx=Context(target=ARCH))


@pytest.mark.parametrize("k,n", PROJECTIONS, ids=[f"{k}x{n}" for k, n in PROJECTIONS])
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_decode_gemv_reads_weights_with_128_bit_loads_and_no_spills(dtype, m, k, n):
    layer = torch.nn.Linear(k, n, bias=False, dtype=DTYPES[dtype])
    prog = _compile(layer, torch.randn(m, k, dtype=DTYPES[dtype]))
    source, arch = prog.source("cuda"), Context(target=ARCH).arch
    (split,) = [t for t in prog.lowered.tile.kernels if t.name.endswith("_splitk")]
    knobs = dict(split.knobs)
    assert knobs["INSTR"] in ("mma", "wgmma") and knobs["TILE_M"] >= m     # one tile along M
    slices = knobs["SPLIT_K"]
    shortest = max(GEMV_K_MIN, min(K_MIN, 16 * m))
    assert slices > 1 and (split.grid >= arch.cores or k // (2 * slices) < shortest), \
        f"{split.grid} blocks on {arch.cores} SMs with K split {slices} ways"
    code = sass(source, ARCH)[split.name]
    loads = global_loads(code)
    assert loads and set(loads) <= {128, "tma"}, f"{split.name}'s global loads by width: {loads}"
    # a weight read by pointer is asked of L2 before the grid dependency (TMA's are not yet)
    assert "tma" in loads or prefetches_before_wait(code), \
        f"{split.name} waits before asking L2 for its weight"
    for name, use in resource_usage(source, ARCH).items():
        assert use["spill_stores"] == use["spill_loads"] == 0, f"{name} spills: {use}"


QUANT = [(2048, 256), (5632, 2048)]         # (K, N): K split at N = 256, not at N = 2048


@pytest.mark.parametrize("k,n", QUANT, ids=[f"{k}x{n}" for k, n in QUANT])
@pytest.mark.parametrize("act", ["f32", "bf16"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_quantized_gemv_reads_weights_with_128_bit_loads(m, fmt, act, k, n):
    """Q8_0/Q4_0 at M = 1 to 4 (tile/gemv.py): the quants, their fp16 scales and the activations
    all come by 128-bit loads (LDG.E.128), none byte by byte; at M = 1 K split at N = 256 until
    the grid fills the SMs or every thread takes one block; rows of M > 1 with M innermost (a
    weight row's neighbouring groups); 0 spills."""
    from strata.quant.formats import QuantLinear
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[act]
    layer = QuantLinear.from_linear(torch.nn.Linear(k, n, bias=False), fmt)
    prog = _compile(layer, torch.randn(m, k, dtype=dtype))
    source, arch = prog.source("cuda"), Context(target=ARCH).arch
    gemv = prog.lowered.tile.kernels[0]
    knobs = dict(gemv.knobs)
    # q8_0: 16 points are one 16-byte window of its quants (since 32 o + i // 32 simplifies
    # at VEC 16 too); q4_0: 32 points are one window of its nibbles
    assert gemv.mode == "rows" and knobs["VEC"] == {"q8_0": 16, "q4_0": 32}[fmt], f"{gemv.name}: {knobs}"
    if m > 1:
        assert gemv.domain[-1][1] == m, f"{gemv.name}: {gemv.domain}"
    if n == 256 and m == 1:
        slices = knobs["SPLIT_K"]
        assert gemv.name.endswith("_splitk") and slices > 1
        assert gemv.grid >= arch.cores or knobs["GROUP"] * 32 == k // slices, \
            f"{gemv.grid} blocks on {arch.cores} SMs with K split {slices} ways"
    code = sass(source, ARCH)[gemv.name]
    loads = global_loads(code)
    assert loads and set(loads) == {128}, f"{gemv.name}'s global loads by width: {loads}"
    assert prefetches_before_wait(code), f"{gemv.name} waits before asking L2 for its weight"
    for name, use in resource_usage(source, ARCH).items():
        assert use["spill_stores"] == use["spill_loads"] == 0, f"{name} spills: {use}"


def test_a_q4_0_down_projection_computes_no_exponential_per_weight_row():
    """TinyLlama's Q4_0 down_proj at M = 1 reads SiLU(gate) * up stored once by a kernel of its
    own: the GEMV's machine code has no MUFU.EX2 (fused, every weight row's threads computed the
    5632 exponentials again, at 128 registers a thread; the H200 run read its weights at 218
    GB/s), 128-bit loads only, at most 64 registers, 0 spills."""
    from strata.quant.formats import QuantLinear

    class GatedDown(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.down = QuantLinear.from_linear(torch.nn.Linear(5632, 2048, bias=False), "q4_0")

        def forward(self, gate, up):
            return self.down(torch.nn.functional.silu(gate) * up)
    args = tuple(torch.randn(1, 5632, dtype=torch.bfloat16) for _ in range(2))
    prog = strata.compile(GatedDown().eval(), args, device="sim", ctx=Context(target=ARCH))
    source = prog.source("cuda")
    first, gemv = prog.lowered.tile.kernels
    assert first.name.endswith("_prologue") and gemv.mode == "rows", (first.name, gemv.mode)
    code, use = sass(source, ARCH), resource_usage(source, ARCH)
    assert "MUFU.EX2" in code[first.name] and "MUFU.EX2" not in code[gemv.name]
    assert set(global_loads(code[gemv.name])) == {128}
    assert use[gemv.name]["registers"] <= 64 and use[gemv.name]["spill_stores"] == 0, use


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("m", [1, 3, 4, 5])
def test_quantized_gemv_matches_eager_on_the_simulator(fmt, m):
    """At M <= 4 the byte rows (VEC points a thread), past it the tensor cores; eager's numbers."""
    from strata.quant.formats import QuantLinear
    torch.manual_seed(0)
    layer = QuantLinear.from_linear(torch.nn.Linear(1024, 64, bias=True), fmt).eval()
    x = torch.randn(m, 1024, dtype=torch.bfloat16)
    prog = _compile(layer, x)
    for res in check.verify(prog, layer, (x,), True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"
    gemv = prog.lowered.tile.kernels[0]
    if m <= 4:
        assert dict(gemv.knobs)["VEC"] == {"q8_0": 16, "q4_0": 32}[fmt] and gemv.mode == "rows"
    else:
        assert gemv.mode != "rows", f"{gemv.name}: {gemv.mode}"


@pytest.mark.parametrize("k,n", QUANT, ids=[f"{k}x{n}" for k, n in QUANT])
def test_fp8_gemv_reads_weights_with_128_bit_loads_and_matches_eager(k, n):
    """FP8Linear at M = 1 (`--quant fp8` decode): its e4m3 weights come by 128-bit loads, 16
    points a step (tile/gemv.py's byte rows), not staged byte by byte, decoded by the GPU's own
    conversion (cvt.rn.f16x2.e4m3x2, sm_89+), the activations rounded to e4m3 once; 0 spills;
    the numbers
    match eager on the simulator. (32-bit loads: the row's scale; 16-bit: the bf16 activations,
    whose largest magnitude, their e4m3 scale, each block takes itself before its row:
    tile/passes/block_prelude_reduce.py.)"""
    from strata.quant.fp8 import FP8Linear
    torch.manual_seed(0)
    layer = FP8Linear.from_linear(torch.nn.Linear(k, n, bias=False))
    x = torch.randn(1, k, dtype=torch.bfloat16)
    prog = _compile(layer, x)
    source = prog.source("cuda")
    [gemv] = [t for t in prog.lowered.tile.kernels if "_scaled_mm" in t.name and "VEC" in dict(t.knobs)
              and dict(t.knobs).get("GROUP", 1) > 1]
    assert gemv.mode == "rows" and dict(gemv.knobs)["VEC"] == 16, f"{gemv.name}: {gemv.knobs}"
    code = sass(source, ARCH)[gemv.name]
    loads = global_loads(code)
    assert loads[128] >= 2 and set(loads) <= {128, 32, 16} and loads[32] <= 2, \
        f"{gemv.name}'s global loads by width: {loads}"
    assert "Combine(" in str(gemv) and not any("abs" in t.name or "amax" in t.name
                                                for t in prog.lowered.tile.kernels), \
        "the activations' scale is taken in the GEMV's blocks, not by a kernel of its own"
    assert "F2FP.F16.E4M3" in code          # sm_89+: one conversion instruction, not integer ops
    # the activations rounded to e4m3 once, by a kernel of their own (materialize_prologue),
    # not divided and rounded again for every weight row
    assert any(t.name.endswith("_prologue") and any(b.dtype == "f8e4m3" for b in t.buffers
                                                    if b.name in t.writes)
               for t in prog.lowered.tile.kernels)
    for name, use in resource_usage(source, ARCH).items():
        assert use["spill_stores"] == use["spill_loads"] == 0, f"{name} spills: {use}"
    if k < 4096:
        assert check.verify(prog, layer, (x,)).passed


@pytest.mark.parametrize("m,dtype", [(1, "bf16"), (16, "f16")])
def test_split_gemv_matches_eager_on_the_simulator(m, dtype):
    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 128, bias=False, dtype=DTYPES[dtype]).eval()
    x = torch.randn(m, 512, dtype=DTYPES[dtype])
    prog = _compile(layer, x)
    for res in check.verify(prog, layer, (x,), True).outputs:
        assert res.passed, res.problem or f"{res.name}: rel err {res.rel:.3g} (tol {res.tol})"
    split = prog.lowered.tile.kernels[0]
    assert split.name.endswith("_splitk") and dict(split.knobs)["SPLIT_K"] > 1
    assert dict(split.knobs)["INSTR"] == ("mma" if m == 1 else "wgmma")


@pytest.mark.parametrize("k,n", PROJECTIONS, ids=[f"{k}x{n}" for k, n in PROJECTIONS])
def test_two_byte_weights_as_rows_read_with_128_bit_loads(k, n):
    """bf16 weights at M = 1 with INSTR=fma pinned (tile/gemv.py's rows, the form a GPU run's
    gemv_sweep weighs against mma.sync): every global load of the GEMV 128 bits, the weight
    asked of L2 before the grid dependency, at most 40 registers (8 blocks of 256 an SM), 0
    spills."""
    layer = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        prog = strata.compile(layer.eval(), (torch.randn(1, k, dtype=torch.bfloat16),), device="sim",
                              ctx=Context(target=ARCH, knobs={"INSTR": "fma"}))
    source = prog.source("cuda")
    gemv = prog.lowered.tile.kernels[0]
    assert gemv.mode == "rows" and dict(gemv.knobs)["VEC"] == 8, (gemv.name, gemv.knobs)
    code = sass(source, ARCH)[gemv.name]
    assert set(global_loads(code)) == {128} and prefetches_before_wait(code), global_loads(code)
    use = resource_usage(source, ARCH)
    assert use[gemv.name]["registers"] <= 40, use
    for name, u in use.items():
        assert u["spill_stores"] == u["spill_loads"] == 0, f"{name} spills: {u}"
