"""cpu_int8_rows: a prefill's product by a block-quantized weight on int8 dot products (QGEMM=int8,
the default where the CPU has AVX512-VNNI and M >= 16): each reduction a kernel over groups of 8
weight rows, stated as a QuantRows form and printed as codegen/c_int8_rows.py's call; run
natively against float64 eager for every format, odd M, both scale dtypes, a merged gate/up
with its SiLU epilogue, an o_proj whose activations are head-major (stored as rows first) and
the simulator running the same Kernel IR as written; QGEMM=bf16, N not a multiple of 8 and
little work (M * N * K under MIN_WORK) keep the bf16 path.

Tolerance: int8 activations (blocks of 32, as llama.cpp and QDOT=vnni round them) err about 0.6%
of the output's norm; the outputs are checked against float64 eager by norm within 1.5e-2, and
against eager with its activations rounded the same way (`QuantLinear.int8_activations`) within
bf16's tolerance, so a lost term (an offset, a minimum, a row) fails both.
"""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import strata
from conftest import HAS_CC
from strata.core.context import Context
from strata.kernel_ir.sim import simulate
from strata.api import to_numpy
from strata.quant.formats import QuantLinear
from strata.core.targets import host
from test_cpu_dot import BF16, assert_matches, cpu_compile, knobs_of

VNNI_TARGET = replace(host(), name="cpu-vnni", features=host().features | {
    "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c"})
VNNI = all(host().has(f) for f in ("avx512_vnni", "avx512bw", "avx512vl"))
pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")
needs_vnni = pytest.mark.skipif(not VNNI, reason="this CPU lacks AVX512-VNNI: the int8 rows' "
                                "kernel cannot run here (their loops as written run on the sim)")


def layer_of(fmt, k, n, scales=torch.float16, seed=0):
    torch.manual_seed(seed + k + n)
    layer = QuantLinear.from_linear(torch.nn.Linear(k, n, bias=False), fmt).eval()
    for name in ("d", "dmin"):
        if hasattr(layer, name):
            setattr(layer, name, getattr(layer, name).to(scales))
    return layer


def close(got, fn, inputs):
    """By norm against float64 eager, and against eager with int8-rounded activations."""
    want = fn(*[x.double() if x.is_floating_point() else x for x in inputs])
    err = ((got.double() - want).norm() / want.norm()).item()
    assert err < 1.5e-2, err
    QuantLinear.int8_activations = True
    try:
        rounded = fn(*[x.float() if x.is_floating_point() else x for x in inputs]).double()
    finally:
        QuantLinear.int8_activations = False
    near = ((got.double() - rounded).norm() / rounded.norm()).item()
    assert near < 8e-3, near            # bf16 outputs' rounding, not int8's


@needs_vnni
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0", "q4_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("m,k,n,scales", [(16, 256, 8, torch.float16), (17, 512, 24, torch.float16),
                                          (33, 256, 16, BF16), (40, 768, 8, torch.float16)],
                         ids=str)
def test_a_quantized_prefill_runs_on_int8_rows(fmt, m, k, n, scales):
    layer = layer_of(fmt, k, n, scales)
    x = torch.randn(m, k).to(BF16)
    prog, log = cpu_compile(layer, (x,), {"QGEMM": "int8"}, target=VNNI_TARGET)
    source = prog.source("c")
    assert knobs_of(prog, "k_linear_reduce_int8")["QGEMM"] == "int8"
    assert f"{fmt} rows by {m} activation rows on int8 dot products" in source
    assert "= st_quantize_rows_bf16(" in source and "on int8 dot products by" in log
    close(prog(x), layer, (x,))


@needs_vnni
def test_a_merged_gate_and_up_with_their_silu_and_a_head_major_o_proj():
    gate, up = layer_of("q4_k", 256, 32, seed=1), layer_of("q4_k", 256, 32, seed=2)
    o_proj = layer_of("q4_0", 128, 16, seed=3)

    def block(x, attn):                 # SiLU(gate) * up; attention's (1, 4, M, 32) joined
        mlp = F.silu(gate(x)) * up(x)
        return mlp, o_proj(attn.transpose(1, 2).reshape(1, -1, 128))
    inputs = (torch.randn(1, 20, 256).to(BF16), torch.randn(1, 4, 20, 32).to(BF16))
    prog, log = cpu_compile(block, inputs, {"QGEMM": "int8"}, target=VNNI_TARGET)
    assert log.count("on int8 dot products by") == 3
    assert "M-side operand" in log                  # the heads stored as rows first
    assert prog.source("c").count("activation rows on int8 dot products") == 3
    for got, fn in zip(prog(*inputs), (lambda x, a: block(x, a)[0], lambda x, a: block(x, a)[1])):
        close(got, fn, inputs)


def test_the_simulator_runs_the_int8_rows_as_written():
    """The same Kernel IR on the simulator (the sanitizer, no C compiled): a QuantRows is its
    loops, QuantRows of int8 activations, so it matches eager with the activations rounded."""
    layer = layer_of("q4_k", 256, 16)
    x = torch.randn(18, 256).to(BF16)
    ctx = Context(knobs={"QGEMM": "int8", "QDOT": "vnni"}, target=VNNI_TARGET)
    prog = strata.compile(layer, (x,), device="cpu", until="c", ctx=ctx)
    assert "quantrows q4_k x 18 rows" in prog.lowered.text("kernel")
    feed = {name: to_numpy(t) for name, t in [*zip(prog.torch_program.inputs, [x]),
                                              *prog.torch_program.weights.items()]}
    got = torch.from_numpy(simulate(prog.lowered.kernel, feed)[prog.lowered.kernel.outputs[0]])
    close(got, layer, (x,))


@pytest.mark.parametrize("knobs,m,n", [({"QGEMM": "bf16"}, 128, 256), ({"QGEMM": "int8"}, 16, 12),
                                        ({}, 16, 64)], ids=["pinned", "n12", "small"])
def test_qgemm_bf16_n_off_the_groups_or_little_work_keeps_the_bf16_path(knobs, m, n):
    layer = layer_of("q4_0", 256, n)
    x = torch.randn(m, 256).to(BF16)
    prog, _ = cpu_compile(layer, (x,), knobs, target=VNNI_TARGET)
    assert "int8 dot products" not in prog.source("c")
    assert "q4_0 blocks stored as vector code" in prog.source("c")
    assert_matches(prog, layer, (x,))


def test_int8_rows_are_the_default_where_the_cpu_has_vnni_and_no_amx():
    layer, x = layer_of("q4_k", 512, 64), torch.randn(128, 512).to(BF16)   # MIN_WORK exactly
    source = cpu_compile(layer, (x,), target=VNNI_TARGET)[0].source("c")
    assert "activation rows on int8 dot products" in source
    amx = replace(VNNI_TARGET, name="cpu-amx", features=VNNI_TARGET.features | {"amx_bf16", "amx_tile"})
    assert "int8 dot products" not in cpu_compile(layer, (x,), target=amx)[0].source("c")
    q6_k = layer_of("q6_k", 512, 64)            # blocks of 16 too (1.1x-1.2x the bf16 path)
    assert "q6_k rows by 128 activation rows on int8" in cpu_compile(q6_k, (x,), target=VNNI_TARGET)[0].source("c")


@pytest.mark.parametrize("target", ["cpu-avx2", "cpu"])
def test_pinned_int8_rows_elsewhere_run_their_loops_as_written(target):
    """On AVX2 (the kernel on vpmaddubsw where the C is built without AVX-512) and on plain
    x86-64 (no int8 rows there: the split kernel's loops as written, float lanes)."""
    layer, x = layer_of("q4_k", 256, 16), torch.randn(20, 256).to(BF16)
    prog, _ = cpu_compile(layer, (x,), {"QGEMM": "int8", "QDOT": "vnni"}, target=target)
    assert "k_linear_reduce_int8(" in prog.source("c")
    assert ("activation rows on int8 dot products" in prog.source("c")) == (target == "cpu-avx2")
    got, want = prog(x).double(), layer(x.double())
    assert ((got - want).norm() / want.norm()).item() < 1.5e-2


@needs_vnni
def test_a_nan_or_an_infinity_in_one_prompt_row_spoils_that_row_only():
    """A row's int8 blocks are scaled by their max |x|, which skipped a NaN: that row's outputs
    were finite garbage where eager's are NaN. Now they are NaN (or infinite), the others exact."""
    layer, x = layer_of("q4_0", 256, 16), torch.randn(20, 256).to(BF16)
    prog, _ = cpu_compile(layer, (x,), {"QGEMM": "int8"}, target=VNNI_TARGET)
    x[3, 7], x[11, 200] = float("nan"), float("inf")
    got = prog(x)
    assert not got[[3, 11]].isfinite().any()
    rest = [i for i in range(20) if i not in (3, 11)]
    close(got[rest], layer, (x[rest],))



@pytest.mark.skipif(not host().has("avx2"), reason="this CPU lacks AVX2: C built for an AVX2-only "
                    "CPU cannot run here")
@pytest.mark.parametrize("m", [17, 40])
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0", "q4_k", "q5_k", "q6_k"])
def test_the_avx2_kernel_built_as_for_an_avx2_only_cpu(fmt, m, monkeypatch):
    """The int8 rows on vpmaddubsw (Zen 3's kernel: unsigned nibbles with their offset or minimum
    taken off by beta, Q8_0 and Q6_K signed through vpsignb), the C built with -march=x86-64-v3
    (no AVX-512) and run here: it is the default there, checked like the VNNI kernel, and a NaN
    row stays NaN."""
    from strata.runtime import cc
    monkeypatch.setattr(cc, "FLAGS", tuple("-march=x86-64-v3" if f == "-march=native" else f
                                           for f in cc.FLAGS))
    layer, x = layer_of(fmt, 512, 24), torch.randn(m, 512).to(BF16)    # 40: 32 rows and 16 a pass
    prog, _ = cpu_compile(layer, (x,), {"QGEMM": "int8"}, target="cpu-avx2")
    assert f"{fmt} rows by {m} activation rows on int8 dot products" in prog.source("c")
    close(prog(x), layer, (x,))
    x[m - 5, 3] = float("nan")
    got = prog(x)
    assert not got[m - 5].isfinite().any() and got[[0, 16]].isfinite().all()
    if m != 17:
        return
    big, xb = layer_of(fmt, 2048, 64), torch.randn(128, 2048).to(BF16)   # the default on an AVX2-only
    prog, _ = cpu_compile(big, (xb,), target="cpu-avx2")                  # CPU at enough work, K in
    assert knobs_of(prog, "k_linear_reduce_int8")["QGEMM"] == "int8"      # several chunks of 512
    close(prog(xb), big, (xb,))
