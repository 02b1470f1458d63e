"""The CPU's instruction forms as Kernel IR statements (kernel_ir/cpu_ir.py, chosen by
kernel_ir/lower_cpu.py from the kernel's FORM): `--ir kernel` prints them, the verifier checks
them, the simulator runs a CPU program's Kernel IR with them against float64 eager, and the C
emitter prints each from its table, for every form there is."""
import io
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import strata
from strata.bench import check
from strata.api import to_numpy
from strata.codegen.c import FORMS as C_PRINTERS
from strata.kernel_ir.sim_cpu import MEANINGS, int8_blocks
from strata.core.context import Context
from strata.core.errors import CompileError
from strata.kernel_ir.cpu_ir import (FORMS, AmxTiles, CpuForm, DotBf16, LaneSum, OuterFma, PairsBf16,
                                    QuantRow, QuantRows)
from strata.kernel_ir.ir import walk
from strata.kernel_ir.sim import simulate
from strata.kernel_ir.verify import KernelVerifyError, verify_kernel
from strata.quant.formats import QuantLinear
from strata.core.targets import TARGETS, host

HOST_VNNI = all(map(host().has, ("avx512_vnni", "avx512bw", "avx512vl"))) or \
    not host().has("avx512f") and all(map(host().has, ("avx2", "fma", "f16c")))

BF16 = torch.bfloat16
AVX512 = replace(TARGETS["cpu"], name="cpu-avx512", vector_bytes=64, features=frozenset(
    {"sse2", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}))
AMX = replace(AVX512, name="cpu-amx", features=AVX512.features | {"amx_tile", "amx_bf16"})


def _compile(fn, inputs, target, **knobs):
    ctx = Context(knobs=knobs, stream=io.StringIO(), target=target)
    return strata.compile(fn, inputs, device="cpu", until="c", ctx=ctx)


def _simulated(prog, inputs) -> list:
    """The program's outputs computed by the simulator from its Kernel IR (no C compiled)."""
    feed = {name: to_numpy(x) for name, x in zip(prog.torch_program.inputs, inputs)}
    feed.update({k: to_numpy(v) for k, v in prog.torch_program.weights.items()})
    out = simulate(prog.lowered.kernel, feed)
    return [out[o] for o in prog.lowered.kernel.outputs]


def _forms(prog) -> list:
    return [s for k in prog.lowered.kernel.kernels for s in walk(k.body) if isinstance(s, CpuForm)]


CASES = {   # form -> (target, knobs, dtype, (m, n, k)): small, for the simulator
    AmxTiles: (AMX, {"FORM": "amx"}, BF16, (32, 32, 40)),
    PairsBf16: (AVX512, {"FORM": "pairs"}, BF16, (7, 16, 38)),
    DotBf16: (AVX512, {"FORM": "dot"}, BF16, (3, 5, 67)),
    OuterFma: (AVX512, {"FORM": "outer"}, torch.float32, (7, 32, 13)),
}


@pytest.mark.parametrize("form", list(CASES), ids=lambda f: f.__name__)
def test_each_form_is_kernel_ir_and_the_simulator_runs_it_as_eager(form):
    target, knobs, dtype, (m, n, k) = CASES[form]
    x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    prog = _compile(F.linear, (x, w), target, **knobs)
    forms = _forms(prog)
    assert forms and all(type(s) is form for s in forms), [type(s).__name__ for s in forms]
    assert f"{form.__name__.lower()} " in prog.lowered.text("kernel")     # what --ir kernel shows
    ref = check.eager_reference(F.linear, (x, w))[0]
    got = check.compare("out", "bf16" if dtype == BF16 else "f32", _simulated(prog, (x, w))[0], ref,
                        check.tolerance("bf16" if dtype == BF16 else "f32", True))
    assert got.passed, f"rel err {got.rel:.3g} (tol {got.tol})"


def test_amx_tiles_print_as_tile_code_and_a_short_k_stays_a_loop():
    prog = _compile(F.linear, (torch.randn(32, 64).to(BF16), torch.randn(32, 64).to(BF16)), AMX,
                    FORM="amx")
    (amx,) = {s for s in _forms(prog)}
    assert (len(amx.rows), len(amx.cols[0])) == (32, 2) and amx.check() is None
    assert "st_tile_dp(st_amx, 3, 5, 7);" in prog.lowered.source
    prog = _compile(F.linear, (torch.randn(16, 20).to(BF16), torch.randn(16, 20).to(BF16)), AMX,
                    FORM="amx")          # 10 pairs of K: fewer than a tile's 16, so pairs
    assert {type(s) for s in _forms(prog)} == {PairsBf16} and "st_tile_dp" not in prog.lowered.source


def test_the_verifier_checks_a_forms_operands():
    prog = _compile(F.linear, (torch.randn(3, 40).to(BF16), torch.randn(5, 40).to(BF16)), AVX512,
                    FORM="dot")
    kernel = next(k for k in prog.lowered.kernel.kernels if any(isinstance(s, DotBf16) for s in walk(k.body)))
    verify_kernel(kernel, gpu=False)

    def broken(body, change):
        return tuple(change(s) if isinstance(s, DotBf16) else s.map_bodies(lambda b: broken(b, change))
                     for s in body)
    acc, a, b = next(s for s in walk(kernel.body) if isinstance(s, DotBf16)).accs[0]
    for change, says in ((lambda s: replace(s, accs=((acc, a, "nowhere"),)), "does not load"),
                         (lambda s: replace(s, accs=(("nothing", a, b),)), "undeclared"),
                         (lambda s: replace(s, step=2), "step 2")):
        with pytest.raises(KernelVerifyError, match=says):
            verify_kernel(replace(kernel, body=broken(kernel.body, change)), gpu=False)


def test_every_form_has_a_c_printer_and_a_simulator_meaning_and_a_missing_one_is_named():
    assert set(FORMS) == set(C_PRINTERS) == set(MEANINGS) == set(CASES) | {QuantRow, QuantRows, LaneSum}
    prog = _compile(F.linear, (torch.randn(3, 40).to(BF16), torch.randn(5, 40).to(BF16)), AVX512,
                    FORM="dot")
    from strata.codegen import c
    saved = c.FORMS.pop(DotBf16)
    try:
        with pytest.raises(CompileError, match="no printer for DotBf16"):
            c.emit_program(prog.lowered.kernel, AVX512)
    finally:
        c.FORMS[DotBf16] = saved
    x = torch.randn(3, 40).to(BF16)
    saved = MEANINGS.pop(DotBf16)
    try:
        with pytest.raises(Exception, match="no meaning for DotBf16"):
            _simulated(prog, (x, torch.randn(5, 40).to(BF16)))
    finally:
        MEANINGS[DotBf16] = saved


def test_a_row_kernel_takes_the_dot_form_and_f32_sums_in_lanes():
    """No FORM (a matrix-vector row, cpu_rows): bf16 products along K are a DotBf16 (its loop as
    written summing in lanes); f32 ones a LaneSum."""
    prog = _compile(F.linear, (torch.randn(1, 64).to(BF16), torch.randn(9, 64).to(BF16)), AVX512)
    assert [(type(s), s.lanes) for s in _forms(prog)] == [(DotBf16, 32)]
    prog = _compile(F.linear, (torch.randn(1, 64), torch.randn(9, 64)), AVX512)
    assert [(type(s), s.lanes) for s in _forms(prog)] == [(LaneSum, 32)]
    np.testing.assert_allclose(_simulated(prog, (torch.ones(1, 64), torch.ones(9, 64)))[0], 64.0)


@pytest.mark.parametrize("fmt,qdot", [("q4_0", "vnni"), ("q8_0", "float"), ("q4_k", "vnni"),
                                      ("q5_k", "vnni"), ("q5_k", "float"), ("q6_k", "float")])
def test_a_quantized_row_is_a_quant_row_and_the_simulator_runs_it_as_eager(fmt, qdot):
    torch.manual_seed(1)
    layer = QuantLinear.from_linear(torch.nn.Linear(512, 7, bias=True), fmt).eval().to(BF16)
    x = torch.randn(1, 512).to(BF16)
    prog = _compile(layer, (x,), AMX, QDOT=qdot)
    (row,) = [s for s in _forms(prog) if isinstance(s, QuantRow)]
    assert isinstance(row, QuantRow) and row.fmt == fmt and bool(row.vnni) == (qdot == "vnni")
    assert f"quantrow {fmt} into" in prog.lowered.text("kernel")
    assert ("blocks by int8 dot products" in prog.lowered.source) == (qdot == "vnni")
    ref = check.eager_reference(layer, (x,))[0]
    simulated = _simulated(prog, (x,))[0]
    got = check.compare("out", "bf16", simulated, ref, check.tolerance("bf16", True))
    assert got.passed, f"rel err {got.rel:.3g} (tol {got.tol})"


@pytest.mark.skipif(not HOST_VNNI, reason="this CPU runs no int8 rows (neither AVX512-VNNI nor AVX2 "
                                          "without AVX-512)")
@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_the_simulator_models_the_int8_activations_of_a_vnni_row(fmt):
    """The int8 activations are the CPU's own error: the simulator models it, so a native row
    (f32 out: no output rounding hides it) is far nearer the simulator than eager."""
    torch.manual_seed(2)
    layer = QuantLinear.from_linear(torch.nn.Linear(256, 9, bias=False), fmt).eval()
    x = torch.randn(1, 256)
    native = strata.compile(layer, (x,), device="cpu", ctx=Context(knobs={"QDOT": "vnni"}, stream=io.StringIO()))
    (row,) = [s for s in _forms(native) if isinstance(s, QuantRow)]
    assert row.vnni
    got, ref = native(x).numpy(), check.eager_reference(layer, (x,))[0]
    simulated = _simulated(native, (x,))[0]
    assert np.abs(got - simulated).max() < np.abs(got - ref).max() / 20


def test_int8_blocks_round_as_the_c_prelude():
    x = np.array([0.0] * 32 + [1.0, -2.54] + [0.5] * 30 + [3.0], np.float32)
    y = int8_blocks(x)
    d = np.float32(2.54) / np.float32(127)
    assert (y[:32] == 0).all() and y[-1] == 3.0                    # a zero block; the rest as it is
    np.testing.assert_array_equal(y[32:34], [np.rint(1 / d) * d, -127 * d])


@pytest.mark.parametrize("cols,lanes", [(128, 32), (48, 16), (40, 0), (1024, 0)])
def test_a_short_row_sum_is_a_lane_sum_and_the_simulator_runs_it_as_eager(cols, lanes):
    """A softmax row of a multiple of 16, 32 to 512 long, sums in vector lanes; other rows stay
    loops (omp simd's reduction)."""
    x = torch.randn(3, cols)
    fn = lambda t: torch.softmax(t, -1)        # noqa: E731
    prog = _compile(fn, (x,), AVX512)
    sums = [s for s in _forms(prog) if isinstance(s, LaneSum)]
    assert {s.lanes for s in sums} == ({lanes} if lanes else set())
    assert (f"st_lane_sum{lanes}(" in prog.lowered.source) == bool(lanes)
    got = check.compare("out", "f32", _simulated(prog, (x,))[0], check.eager_reference(fn, (x,))[0],
                        check.tolerance("f32", False))
    assert got.passed, f"rel err {got.rel:.3g} (tol {got.tol})"


def test_every_emitter_refuses_what_its_language_cannot_print_by_the_nodes_own_languages():
    """One table (each node class's `languages`, kernel_ir/ir.py): a CPU form in CUDA, OpenCL or
    HIP, a tensor-core statement in C, are refused naming the node and the language."""
    from strata.codegen import cuda, hip, opencl
    from strata.kernel_ir.ir import Kernel, Mma, Param
    prog = _compile(F.linear, (torch.randn(3, 40).to(BF16), torch.randn(5, 40).to(BF16)), AVX512,
                    FORM="dot")
    kernel = next(k for k in prog.lowered.kernel.kernels if any(isinstance(s, DotBf16) for s in walk(k.body)))
    for emit, name in ((cuda.emit_kernel, "CUDA"), (opencl.emit_kernel, "OpenCL"), (hip.emit_kernel, "HIP")):
        with pytest.raises(CompileError, match=r"uses vdpbf16ps along K \(DotBf16\)"):
            emit(replace(kernel, block=32))
    mma = Kernel("k", (Param("x", "f32", 4, True),), 1, 1, (Mma(("d",), ("a",), ("b",), ("c",), "f16"),))
    from strata.codegen import c
    with pytest.raises(CompileError, match=r"uses a tensor-core mma \(Mma\), which the C target"):
        c.emit_kernel(mma)


def test_every_statement_class_has_a_simulator_step():
    """The simulator looks each statement up by its class (sim.STEPS; a CPU form in
    sim_cpu.MEANINGS): none is missing, and an unknown one is refused by name."""
    from strata.kernel_ir import ir
    from strata.kernel_ir.sim import STEPS

    def subclasses(c):
        return {c, *(x for d in c.__subclasses__() for x in subclasses(d))}
    statements = {c for c in subclasses(ir.Stmt) if c.__module__.startswith("strata.kernel_ir")}
    assert statements - set(STEPS) - set(MEANINGS) - {ir.Stmt, CpuForm} == set()


def test_every_statement_a_language_prints_has_a_printer_in_its_emitter():
    """Each emitter looks a statement's printer up by its class (cfamily.PRINTERS and each
    language's additions): every class a language prints (its `languages`) has one, and a class
    with none is refused by name."""
    from strata.codegen import c, cuda, hip, metal, opencl
    from strata.kernel_ir import ir

    def subclasses(k):
        return {k, *(x for d in k.__subclasses__() for x in subclasses(d))}
    emitters = {"c": c.CEmitter, "cuda": cuda.CudaEmitter, "opencl": opencl.OpenCLEmitter,
                "hip": hip.HipEmitter, "metal": metal.MetalEmitter}
    statements = {k for k in subclasses(ir.Stmt) - {ir.Stmt} if k.__module__.startswith("strata.kernel_ir")}
    missing = [(language, k.__name__) for k in statements for language in k.languages
               if not any(base in emitters[language].PRINTERS for base in k.__mro__)]
    assert missing == []

    class Unknown(ir.Stmt):
        pass
    kernel = ir.Kernel("k", (ir.Param("x", "f32", 4, True),), 1, 1, (Unknown(),))
    with pytest.raises(TypeError, match="CEmitter has no printer for Unknown"):
        c.CEmitter(kernel).stmt(Unknown(), 1)


def test_every_statement_class_has_a_verifier_entry():
    """The verifier finds each statement's rule by its class (verify.RULES, None where the
    operands are all there is to check): strata's every statement class has an entry."""
    from strata.kernel_ir import ir
    from strata.kernel_ir.verify import RULES

    def subclasses(k):
        return {k, *(x for d in k.__subclasses__() for x in subclasses(d))}
    statements = {k for k in subclasses(ir.Stmt) - {ir.Stmt} if k.__module__.startswith("strata.kernel_ir")}
    assert [k.__name__ for k in statements if not any(b in RULES for b in k.__mro__)] == []
