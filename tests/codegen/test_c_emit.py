"""The C emitter (the CPU target) prints readable C11 for one-thread-per-block Kernel IR, puts
`omp simd` only on loops it proves safe (reductions with their clause), and refuses what a CPU
cannot run with one sentence naming kernel and node. No compiler needed here (test_native.py
compiles and runs)."""
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from strata.core import expr as E
from strata.core.errors import CompileError
from strata.kernel_ir.ir import (Assign, BlockIdx, Buffer, For, Kernel, KernelProgram, Let, Load,
                              Param, ShflXor, Smem, Store, Sync, TensorMap)
from strata.codegen.c import SERIAL_WORK, emit_kernel, emit_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import cpu_builders as C  # noqa: E402
import kernel_builders as B  # noqa: E402

RMS_NORM = '''\
// aten.rms_norm @ <snippet>:1
// grid = 32 blocks of one thread, run in parallel (OpenMP)
static void
k_rms_norm(const uint16_t* restrict x, const uint16_t* restrict weight, uint16_t* restrict out) {
    #pragma omp parallel for num_threads(ST_TEAM) schedule(static)
    for (int blockIdx = 0; blockIdx < 32; blockIdx++) {
        float acc = 0.0f;
        #pragma omp simd reduction(+:acc)
        for (int c = 0; c < 2048; c++) {
            float v = st_bf16_to_float(x[blockIdx * 2048 + c]);
            acc += v * v;
        }
        float scale = rsqrtf(acc * 0.00048828125f + 1e-06f);
        #pragma omp simd
        for (int c = 0; c < 2048; c++) {
            float v2 = st_bf16_to_float(x[blockIdx * 2048 + c]);
            float w = st_bf16_to_float(weight[c]);
            out[blockIdx * 2048 + c] = st_float_to_bf16(v2 * scale * w);
        }
    }
}'''


def test_rms_norm_reads_like_hand_written_c():
    assert emit_kernel(C.rms_norm_rows(32, 2048, "bf16").kernels[0]) == RMS_NORM


def _loop_pragmas(src: str) -> list[str]:
    """The pragma (or '') before each inner `for (` that is not the block loop."""
    lines = src.splitlines()
    out = []
    for k, line in enumerate(lines):
        if line.strip().startswith("for (") and "blockIdx = 0" not in line:
            prev = lines[k - 1].strip()
            out.append(prev if prev.startswith("#pragma omp simd") else "")
    return out


@pytest.mark.parametrize("op,dtype,clause", [
    ("sum", "f32", "reduction(+:acc)"), ("prod", "f64", "reduction(*:acc)"),
    ("max", "f32", "reduction(max:acc) reduction(|:acc_nan)"),
    ("min", "bf16", "reduction(min:acc) reduction(|:acc_nan)"),
    ("max", "i32", "reduction(max:acc)"), ("min", "i64", "reduction(min:acc)"),
    ("argmax", "f32", None), ("argmin", "i32", None)])
def test_reduction_loops_get_their_clause(op, dtype, clause):
    """Float max/min reduce with OpenMP's max/min and a NaN flag (NaN propagates, as in torch); an
    argmax updates a value and an index together, so its loop runs in order, without a pragma."""
    [pragma] = _loop_pragmas(emit_kernel(C.row_reduce(3, 100, dtype, op).kernels[0]))
    assert pragma == (f"#pragma omp simd {clause}" if clause else "")


PARAMS = (Param("x", "f32", 64), Param("out", "f32", 64, output=True))


def _loop_kernel(body, params=PARAMS):
    return Kernel("k_loop", params, 2, 1, (For("c", E.Const(0), E.Const(32), 1, tuple(body),
                                                 dtype="i64"),))


X = Load("x", E.add(E.mul(BlockIdx(), 32), E.Var("c")), "f32")
AT = E.add(E.mul(BlockIdx(), 32), E.Var("c"))


@pytest.mark.parametrize("name,body,safe", [
    ("one element per iteration", [Store("out", AT, X)], True),
    ("in place at the same index",
     [Store("out", AT, E.call("add", Load("out", AT, "f32"), X))], True),
    ("through a Let", [Let("j", "i64", AT), Store("out", E.Var("j"), X)], True),
    ("every iteration writes out[b]", [Store("out", BlockIdx(), X)], False),
    ("reads a neighbour it writes",
     [Store("out", AT, Load("out", E.add(AT, 1), "f32"))], False),
    ("two offsets closer than the step",
     [Store("out", AT, X), Store("out", E.add(AT, 1), X)], False),
    ("an outer variable, not an accumulator",
     [Assign("last", X), Store("out", AT, E.Var("last", "f32"))], False),
    ("an accumulator read elsewhere",
     [Assign("acc", E.call("add", E.Var("acc", "f32"), X)), Store("out", AT, E.Var("acc", "f32"))],
     False),
    ("a nested loop", [For("d", E.Const(0), E.Const(1), 1, (Store("out", AT, X),))], False),
])
def test_simd_only_where_iterations_are_independent(name, body, safe):
    decl = [Let("last", "f32", E.Const(0.0, "f32")), Let("acc", "f32", E.Const(0.0, "f32"))]
    k = _loop_kernel(body)
    k = replace(k, body=(*decl, *k.body))
    pragmas = _loop_pragmas(emit_kernel(k))
    assert (pragmas[0] == "#pragma omp simd") == safe, name


def test_block_and_thread_indices_fold():
    """threadIdx.x is 0 and blockIdx.x the parallel loop's variable; a one-block kernel has no
    parallel loop."""
    src = emit_kernel(B.scalar_op_kernels("f32", n=7, block=1).kernels[0])
    assert "int i = blockIdx;" in src and "threadIdx" not in src
    assert "for (int blockIdx = 0; blockIdx < 7; blockIdx++)" in src
    one = emit_kernel(C.row_reduce(1, 10, "f32", "sum").kernels[0])
    assert "omp parallel" not in one and "const int blockIdx = 0;" in one


def test_unrolled_loops_and_wide_indices():
    """A loop the schedule marks unrolled gets `#pragma GCC unroll <trips>` when its trip count
    is a constant, unless it takes `#pragma omp simd` (gcc wants the loop right after either, so
    a loop gets one); buffers of 2^31 elements index in long long, as in CUDA."""
    k = replace(_loop_kernel([Store("out", AT, X)]), body=(For(
        "c", E.Const(0), E.Const(4), 1, (Store("out", AT, X),), unroll=True, dtype="i64"),))
    src = emit_kernel(k)
    assert "    #pragma omp simd\n        for (int c = 0; c < 4; c++)" in src and "GCC unroll" not in src
    big = replace(k, params=(Param("x", "f32", 2 ** 31), Param("out", "f32", 2 ** 31, output=True)))
    src = emit_kernel(big)
    assert "for (long long blockIdx = 0; blockIdx < 2; blockIdx++)" in src
    assert "for (long long c = 0; c < 4; c++)" in src


def test_16_bit_storage_and_vector_accesses_are_elements():
    src = emit_kernel(C.vector_scale(64, "f16", 8).kernels[0])
    assert "const uint16_t* restrict x" in src and "uint16_t* restrict out" in src
    assert "float x7 = st_f16_to_float(x[base + 7]);" in src
    assert "out[base + 7] = st_float_to_f16(x7 * 3.0f);" in src
    bf = emit_kernel(C.vector_scale(64, "bf16", 8).kernels[0])
    assert "st_bf16_to_float(x[base + 1])" in bf and "st_float_to_bf16(x1 * 3.0f)" in bf


def test_c_spellings_of_the_cpp_templates():
    """logical_xor's bool(x) and int min/max with a literal (decltype in CUDA) are C here; f64
    calls the double functions."""
    src = emit_program(C.mask_ops(7, chunk=4))
    assert "flip[i] = (bool)m != (bool)(a > 0.5f);" in src
    assert "i < min(blockIdx * 4 + 4, 7)" in src and "decltype" not in src
    f64 = emit_program(C.op_outputs("f64", 8)[0])
    assert "exp(a)" in f64 and "expf" not in f64.split("strata_num_threads")[1]


def test_entry_point_calls_kernels_in_order_with_buffer_slots():
    src = emit_program(C.two_kernels_in_place(100))
    entry = src[src.index("void strata_run"):]
    assert entry.splitlines()[1:4] == [
        "    k_scale((const float*)args[0], (float*)args[3]);",
        "    k_add((const float*)args[3], (const float*)args[1], (float*)args[4]);",
        "    k_update((const float*)args[4], (float*)args[2]);"]
    assert "//   args[3] t: f32[100] temp" in src


def test_a_kernel_launched_twice_is_defined_once():
    p = C.row_reduce(3, 10, "f32", "sum")
    twice = KernelProgram(p.buffers, [p.kernels[0], p.kernels[0]], p.outputs)
    src = emit_program(twice)
    assert src.count("static void k_sum_rows(") == 1 and src.count("    k_sum_rows(") == 2


def test_no_kernels_is_an_empty_entry_point():
    src = emit_program(C.empty_program())
    assert "void strata_run(void** args) {\n    (void)args;" in src


@pytest.mark.parametrize("make,words", [
    (lambda: B.rms_norm(rows=4, cols=256), ["k_rms_norm_reduce", "block=256"]),
    (lambda: B.elementwise(100, block=32), ["k_ew_sigmoid", "block=32"]),
    (lambda: _with(Let("s", "f32", ShflXor(E.Const(1.0, "f32"), 1, "f32"))),
     ["k_loop", "warp shuffle (ShflXor)"]),
    (lambda: replace(_loop_kernel([]), params=(Param("x", "f32", 64, tensor_map=TensorMap(
        (64,), (), (64,))), Param("out", "f32", 64, output=True))), ["k_loop", "tensor map"]),
])
def test_kernels_a_cpu_cannot_run_are_refused(make, words):
    k = make()
    program = k if isinstance(k, KernelProgram) else KernelProgram(
        [Buffer("x", "f32", (64,), "input"), Buffer("out", "f32", (64,), "output")], [k], ["out"])
    with pytest.raises(CompileError) as err:
        emit_program(program)
    msg = str(err.value)
    assert all(w in msg for w in words), msg
    assert "\n" not in msg and re.search(r"one thread per block \(block=1\)", msg)


def test_scratch_arrays_are_per_thread_and_barriers_vanish():
    """Smem in a one-thread block (the CPU matmul's packed panel) is a scratch array each OpenMP
    thread allocates once, outside the block loop; a Sync has nothing to wait for."""
    k = _loop_kernel([Store("tile", E.Var("c"), X), Sync(),
                      Store("out", AT, Load("tile", E.Var("c"), "f32"))])
    src = emit_program(KernelProgram([Buffer("x", "f32", (64,), "input"),
                                      Buffer("out", "f32", (64,), "output")],
                                     [replace(k, grid=8192, body=(Smem("tile", "f32", 32), *k.body))],
                                     ["out"]))
    body = src.split("static void k_loop(")[1]
    assert body.index("#pragma omp parallel") < body.index("st_scratch(32 * sizeof(float))") \
        < body.index("#pragma omp for") < body.index("free(tile)")
    assert "Sync" not in body and "barrier" not in body


def test_a_kernel_with_little_work_runs_its_blocks_in_turn():
    """Waking the OpenMP team costs 1.5 to 2 us: 2 blocks of 32 elements stay on one thread;
    8192 such blocks are shared out."""
    k = _loop_kernel([Store("out", AT, X)])
    small = emit_program(KernelProgram([Buffer("x", "f32", (64,), "input"),
                                        Buffer("out", "f32", (64,), "output")], [k], ["out"]))
    assert "omp parallel" not in small and f"in turn (under {SERIAL_WORK} statements" in small
    big = emit_program(KernelProgram([Buffer("x", "f32", (64,), "input"),
                                      Buffer("out", "f32", (64,), "output")],
                                     [replace(k, grid=8192)], ["out"]))
    assert "#pragma omp parallel for num_threads(ST_TEAM) schedule(static)" in big



def test_a_transcendental_call_counts_as_more_work():
    """A tanh costs libmvec about 3 cycles an element, a vectorised store a fraction of one: 256
    blocks of 32 stores stay on one thread, the same blocks storing tanh(x) are shared out (GELU
    at seq 1 ran 1.10x-1.16x faster on 2 threads, 2-core Zen 3)."""
    bufs = [Buffer("x", "f32", (8192,), "input"), Buffer("out", "f32", (8192,), "output")]
    plain = replace(_loop_kernel([Store("out", AT, X)]), grid=256)
    tanh = replace(_loop_kernel([Store("out", AT, E.call("tanh", X))]), grid=256)
    assert "omp parallel" not in emit_program(KernelProgram(bufs, [plain], ["out"]))
    assert "#pragma omp parallel for" in emit_program(KernelProgram(bufs, [tanh], ["out"]))

def _with(stmt) -> Kernel:
    k = _loop_kernel([Store("out", AT, X)])
    return replace(k, body=(stmt, *k.body))


@pytest.mark.parametrize("code, threads, pragma", [
    ("torch.softmax(torch.randn(64, 1000), dim=-1)", 1, None),
    ("torch.softmax(torch.randn(64, 1000), dim=-1)", 2, "#pragma omp parallel num_threads(2)"),
    ("torch.softmax(torch.randn(2, 8), dim=-1)", 2, "#pragma omp parallel num_threads(2)"),
    ("torch.randn(64, 1000) + 1", 2, "#pragma omp parallel for num_threads(2)"),
    ("torch.randn(64, 96) @ torch.randn(96, 128)", 1, None),
])
def test_threads_knob_sets_the_team(code, threads, pragma):
    """THREADS=1 runs every block in turn (no fork), THREADS=n a team of n whatever the work;
    unpinned, the emitter decides by work (the header shows THREADS=0)."""
    from strata.api import compile_snippet
    from strata.core.context import Context
    program, _ = compile_snippet(code, Context(target="host", knobs={"THREADS": threads}), until="c")
    kernels = program.lowered.source.split("omp_get_max_threads")[-1]     # after the prelude
    if pragma is None:
        assert "omp parallel" not in kernels and "static void" in kernels
    else:
        assert pragma in kernels
    default, _ = compile_snippet(code, Context(target="host"), until="tile")
    assert "THREADS=0" in default.ir("tile")
