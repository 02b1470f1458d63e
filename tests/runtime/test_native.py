"""The native CPU target (codegen/c.py -> runtime/cc.py -> runtime/native.py) computes what the
simulator computes: bit for bit where the C and NumPy operations are the same IEEE operations,
within 1e-6 relative for libm's transcendental functions (glibc and NumPy differ by an ulp or
two). Reductions take data whose sums and products are exact in every order, so the reassociation
`omp simd reduction` allows shows as no difference. Also: the runtime's argument handling (weights,
temps in one slab, inputs updated in place, 0-d and empty buffers), the compile cache (a second
program compiles nothing, concurrent processes leave one sound entry, a damaged one is rebuilt),
OMP_NUM_THREADS, and the errors a user can meet."""
import hashlib
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from racing_children import race
import torch

import strata
from strata.core import dtypes
from strata.core.errors import CompileError, DeviceUnavailable, InputMismatch
from strata.kernel_ir.lower_cpu import lower_cpu_forms
from strata.kernel_ir.sim import simulate
from strata.runtime import cache, cc, native_build
from strata.runtime.native import NativeProgram
from strata.codegen.c import emit_program

try:
    cc.find_compiler()
except DeviceUnavailable:
    pytest.skip("no C compiler ($CC, cc, gcc or clang) is installed, so the native CPU target "
                "cannot be built or tested here; install gcc to run these tests",
                allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import cpu_builders as C  # noqa: E402
import kernel_builders as B  # noqa: E402

TRANSCENDENTAL = {"pow", "exp", "exp_shifted", "exp2", "log", "log1p", "expm1", "tanh", "sigmoid",
                  "erf", "sin", "cos"}
FLOATS = ("f32", "f64", "bf16", "f16")


# ---------------------------------------------------------------- helpers

def random_inputs(program, rng, kind: str = "positive") -> dict[str, np.ndarray]:
    """Simulator inputs for the program's input and weight buffers (bf16 as float32 values).
    kind "positive": floats in [0.1, 4.1), ints in [1, 100); "exact": multiples of 1/8 (floats)
    or small ints, whose sums are exact in any order; "signs": +-1 (products exact)."""
    out = {}
    for b in program.buffers:
        if b.kind not in ("input", "weight"):
            continue
        if b.dtype == "bool":
            a = rng.random(b.shape) < 0.5
        elif kind == "signs":
            a = rng.choice([-1.0, 1.0, 1.0, 2.0, 0.5] if dtypes.is_float(b.dtype) else [-1, 1],
                           b.shape)
        elif kind == "exact":
            a = rng.integers(-100, 100, b.shape) / (8 if dtypes.is_float(b.dtype) else 1)
        elif dtypes.is_float(b.dtype):
            a = rng.random(b.shape) * 4 + 0.1
        else:
            a = rng.integers(1, 100, b.shape)
        if dtypes.is_float(b.dtype) and b.dtype != "f64":
            a = np.asarray(a, dtype=np.float32)
        out[b.name] = np.asarray(dtypes.round_to(np.asarray(a), b.dtype)).reshape(b.shape)
    return out


def to_torch(a: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtypes.to_torch(dtype))


def native_run(program, data):
    weights = {b.name: to_torch(data[b.name], b.dtype) for b in program.buffers if b.kind == "weight"}
    prog = NativeProgram(program, weights)
    return prog.run([to_torch(data[name], b.dtype) for name, b in prog.spec.items()])


def as_f64(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.to(torch.float64).numpy() if t.dtype != torch.bool else t.numpy()
    return np.asarray(t).astype(np.float64)


def compare(program, data, rtol: dict | None = None) -> None:
    """Native against simulated outputs: bit for bit, or within rtol[name] relative."""
    want = simulate(program, data)
    got = native_run(program, data)
    for name, g in zip(program.outputs, got):
        b = program.buffer(name)
        assert tuple(g.shape) == tuple(b.shape) and g.dtype == dtypes.to_torch(b.dtype), name
        tol = (rtol or {}).get(name)
        if tol is None:
            np.testing.assert_array_equal(as_f64(g), as_f64(want[name]), err_msg=name)
        else:
            np.testing.assert_allclose(as_f64(g), as_f64(want[name]), rtol=tol, atol=0,
                                       err_msg=name)


# ---------------------------------------------------------------- results against the simulator

@pytest.mark.parametrize("dtype", [*FLOATS, "i32", "i64", "i8", "u8"])
def test_every_scalar_op_matches_the_simulator(dtype):
    """One kernel per op of scalar_ops.py; 1009 elements in blocks of 64 (a partial last block)."""
    program, ops = C.op_outputs(dtype, 1009, chunk=64)
    # libm (and libmvec's vector versions, at most 4 ulp off) against the simulator's NumPy:
    # a few float ulps, which a 16-bit output's rounding can turn into one of its own ulps
    tol = 1e-6 if dtype in ("f32", "f64") else 2 ** -7
    tols = {f"out_{op}": tol for op in ops if op in TRANSCENDENTAL}
    if dtype == "f64":              # C's fma rounds once; NumPy has none (product, then sum)
        tols["out_fma"] = 1e-15
    compare(program, random_inputs(program, np.random.default_rng(1)), tols)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_maximum_and_minimum_take_nan_and_zero_signs_as_the_simulator(dtype):
    program = C.op_outputs(dtype, 8, chunk=8)[0]
    keep = {"k_op_maximum", "k_op_minimum"}
    program.kernels[:] = [k for k in program.kernels if k.name in keep]
    program.buffers[:] = [b for b in program.buffers if b.kind == "input" or
                          b.name in ("out_maximum", "out_minimum")]
    program.outputs[:] = ["out_maximum", "out_minimum"]
    t = dtypes.to_numpy(dtype)
    data = {"x": np.array([-0.0, 0.0, np.nan, 1, np.nan, np.inf, -np.inf, 2], t),
            "y": np.array([0.0, -0.0, 1, np.nan, np.nan, -np.inf, 3, 2], t)}
    want = simulate(program, data)
    for name, g in zip(program.outputs, native_run(program, data)):
        np.testing.assert_array_equal(g.numpy(), want[name], err_msg=name)
        assert (np.signbit(g.numpy()) == np.signbit(want[name])).all(), name


@pytest.mark.parametrize("n", [1, 7, 1009])
@pytest.mark.parametrize("chunk", [None, 64])
def test_bool_buffers_and_odd_sizes(n, chunk):
    program = C.mask_ops(n, chunk)
    compare(program, random_inputs(program, np.random.default_rng(n)))


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "i32"])
def test_row_reductions_match_the_simulator(op, dtype):
    program = C.row_reduce(3, 1009, dtype, op)
    kind = "signs" if op == "prod" else "exact"
    compare(program, random_inputs(program, np.random.default_rng(2), kind))


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 7), (5, 1009), (3, 128), (2, 48)])
@pytest.mark.parametrize("op", ["sum", "max", "argmax"])
def test_reduction_sizes(rows, cols, op):
    kernels = C.row_reduce(rows, cols, "f32", op).kernels      # lowered as the pipeline lowers
    program = replace(C.row_reduce(rows, cols, "f32", op), kernels=[lower_cpu_forms(k) for k in kernels])
    compare(program, random_inputs(program, np.random.default_rng(cols), "exact"))
    laned = op == "sum" and cols in (48, 128)       # short rows add into lanes, then a tree
    assert (f"+= st_lane_sum{32 if cols % 32 == 0 else 16}(" in emit_program(program)) == laned


@pytest.mark.parametrize("op", ["max", "min", "argmax", "argmin"])
def test_nan_wins_a_vectorised_max_as_in_torch(op):
    """OpenMP's own max reduction drops NaN in vector code; the loop's NaN flag keeps it, wherever
    the NaN is (a vector's middle, the scalar tail, the first element)."""
    program = C.row_reduce(4, 1009, "f32", op)
    data = random_inputs(program, np.random.default_rng(3))
    data["x"][1, 500] = np.nan
    data["x"][2, 1008] = np.nan
    data["x"][3, 0] = np.nan
    compare(program, data)
    got = as_f64(native_run(program, data)[0])
    if op in ("max", "min"):
        assert np.isnan(got[1:]).all() and not np.isnan(got[0])
    else:
        assert list(got[1:]) == [500, 1008, 0]


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_rms_norm_with_a_weight(dtype):
    """A reduction loop then a store loop; the sum of squares is exact (multiples of 1/64), so
    its vectorised order cannot flip the rounding of a 16-bit output."""
    program = C.rms_norm_rows(5, 1009, dtype)
    compare(program, random_inputs(program, np.random.default_rng(4), "exact"))


@pytest.mark.parametrize("dtype,width", [("f32", 4), ("f16", 8), ("bf16", 8), ("i32", 4)])
def test_vector_accesses(dtype, width):
    program = C.vector_scale(64, dtype, width)
    compare(program, random_inputs(program, np.random.default_rng(5)))


def test_half_conversions_match_numpy():
    """Every f16 bit pattern to float; float to f16 and bf16 at the rounding edges (halfway
    cases, subnormals, the overflow threshold, inf, NaN) and on a million random bit patterns.
    (All 2^32 floats were checked once against the CPU's F16C conversion: no difference.)"""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    got = native_run(C.convert(len(halves), "f16", "f32"), {"x": halves})[0]
    np.testing.assert_array_equal(as_f64(got), halves.astype(np.float64))
    edges = np.array([65504, 65519.99, 65520, 65536, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
                      2.0 ** -25 * 1.0001, 3 * 2.0 ** -26, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11,
                      1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, np.inf, np.nan, 0.0, 1e-45, 3.4e38],
                     dtype=np.float32)
    bits = np.random.default_rng(6).integers(0, 2 ** 32, 1 << 20, dtype=np.uint64)
    floats = np.concatenate([edges, -edges, bits.astype(np.uint32).view(np.float32)])
    for dtype in ("f16", "bf16"):
        got = native_run(C.convert(len(floats), "f32", dtype), {"x": floats})[0]
        with np.errstate(over="ignore"):              # NumPy warns on its own overflow to inf
            want = dtypes.round_to(floats, dtype)
        np.testing.assert_array_equal(as_f64(got), as_f64(want), err_msg=dtype)


@pytest.mark.parametrize("dtype", dtypes.FLOAT8)
def test_fp8_conversions_match_torch(dtype):
    """Every FP8 bit pattern to float; float to FP8 bit for bit as torch converts it, at the
    edges (ties, subnormals, the saturation of e4m3fn at 448, e5m2's overflow to inf, NaN) and on
    a million random bit patterns."""
    t = dtypes.to_torch(dtype)
    every = torch.arange(256, dtype=torch.uint8).view(t).float()
    got = native_run(C.convert(256, dtype, "f32"), {"x": every.numpy()})[0]
    np.testing.assert_array_equal(as_f64(got), as_f64(every))
    edges = np.array([448, 464, 464.01, 480, 57344, 61439, 61440, 65536, 2.0 ** -6, 2.0 ** -9,
                      2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -16, 2.0 ** -17, 3 * 2.0 ** -18, np.inf,
                      np.nan, 0.0, 1e-45, 3.4e38], dtype=np.float32)
    bits = np.random.default_rng(7).integers(0, 2 ** 32, 1 << 20, dtype=np.uint64)
    floats = np.concatenate([edges, -edges, bits.astype(np.uint32).view(np.float32)])
    got = native_run(C.convert(len(floats), "f32", dtype), {"x": floats})[0]
    want = torch.from_numpy(floats).to(t)
    np.testing.assert_array_equal(got.view(torch.uint8).numpy(), want.view(torch.uint8).numpy())


def test_float_exp_is_within_one_and_a_half_ulps_and_keeps_every_special():
    """The prelude's branch-free expf (vectorised inline) against exp in float64: 2^21 bit
    patterns spread over every float, the ends of its range (subnormal results, overflow) and
    the specials (a causal mask's -inf gives 0, NaN stays NaN)."""
    import strata
    edges = np.array([0.0, -0.0, 1.0, -1.0, 88.72, 88.7229, 88.73, 89.5, -87.33, -87.34, -100.0,
                      -103.28, -103.97, -103.98, -104.0, -105.0, -np.inf, np.inf, np.nan, 1e-30,
                      -1e-30], dtype=np.float32)
    bits = np.arange(0, 2 ** 32, 2 ** 11, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = torch.from_numpy(np.concatenate([edges, bits]))
    with np.errstate(all="ignore"):         # NumPy warns on overflow and NaN (its own, the check's)
        got = strata.compile(torch.exp, (x,), device="cpu")(x).numpy().astype(np.float64)
        want = np.exp(x.numpy().astype(np.float64))
        rounded = want.astype(np.float32)
        normal = np.isfinite(rounded) & (rounded != 0)
        ulps = np.abs(got - want)[normal] / np.spacing(np.abs(rounded[normal])).astype(np.float64)
    assert ulps.max() <= 1.5, x.numpy()[normal][ulps.argmax()]
    np.testing.assert_array_equal(got[~normal], rounded[~normal].astype(np.float64))


def test_the_shifted_exp_is_the_exp_down_to_the_smallest_normal_result_then_zero():
    """exp_shifted (a softmax's exp(x - max), x <= 0; kernel_ir/lower_attention_cpu.py): the
    prelude's expf without its clamps, bit for bit the same as `exp` where the result is a normal
    float, 0 below -87.33 (not a subnormal), 0 for -inf, NaN for NaN, as the simulator's NumPy."""
    edges = np.array([0.0, -0.0, -1e-30, -1.0, -87.0, -87.32, -87.33, -87.34, -100.0, -np.inf,
                      np.nan], dtype=np.float32)
    x = np.concatenate([edges, -np.abs(np.random.default_rng(3).standard_normal(4096) * 30)]
                       ).astype(np.float32)
    program = C.unary_ops(len(x), ("exp", "exp_shifted"))
    exp, shifted = (t.numpy() for t in native_run(program, {"x": x}))
    with np.errstate(all="ignore"):
        want = simulate(program, {"x": x})["out_exp_shifted"]
    normal = exp >= np.finfo(np.float32).tiny
    np.testing.assert_array_equal(shifted[normal], exp[normal])
    np.testing.assert_array_equal(shifted[~normal & ~np.isnan(x)], 0.0)
    assert np.isnan(shifted[np.isnan(x)]).all() and (x[~normal & ~np.isnan(x)] < -87.3).all()
    np.testing.assert_allclose(shifted, want, rtol=3e-7, atol=0)     # 1.5 ulp, as exp above


# ---------------------------------------------------------------- the runtime

def test_temps_in_place_inputs_and_program_order():
    program = C.two_kernels_in_place(1009, chunk=64)
    data = random_inputs(program, np.random.default_rng(7))
    want = simulate(program, data)
    cache_t = to_torch(data["cache"], "f32")
    prog = NativeProgram(program)
    assert [s.name for s in prog.plan.slots] == ["t"]
    out, cache_out = prog.run([to_torch(data["x"], "f32"), to_torch(data["y"], "f32"), cache_t])
    np.testing.assert_array_equal(out.numpy(), want["out"])
    np.testing.assert_array_equal(cache_t.numpy(), want["cache"])     # the caller's tensor
    assert cache_out.data_ptr() == cache_t.data_ptr()
    with pytest.raises(InputMismatch, match="cache is updated in place"):
        prog.run([to_torch(data["x"], "f32"), to_torch(data["y"], "f32"),
                  torch.zeros(2018)[::2]])


def test_threads_calling_one_program_at_once_each_get_their_own_temps():
    """A call's temps and pointer array come from a pool (ctypes releases the GIL during the
    call): two threads running the same program on different inputs must not share them."""
    from concurrent.futures import ThreadPoolExecutor
    program = C.two_kernels_in_place(100_003, chunk=64)
    prog = NativeProgram(program)
    feeds = [random_inputs(program, np.random.default_rng(seed)) for seed in range(4)]
    wants = [simulate(program, {k: v.copy() for k, v in data.items()}) for data in feeds]

    def run(data):
        cache_t = to_torch(data["cache"].copy(), "f32")
        out, _ = prog.run([to_torch(data["x"], "f32"), to_torch(data["y"], "f32"), cache_t])
        return out.numpy().copy(), cache_t.numpy().copy()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, feeds * 8))
    for want, (out, cache_out) in zip(wants * 8, results):
        np.testing.assert_array_equal(out, want["out"])
        np.testing.assert_array_equal(cache_out, want["cache"])
    assert 1 <= len(prog._spare_calls) <= 4


def test_non_contiguous_inputs_are_copied():
    program = C.mask_ops(7)
    data = random_inputs(program, np.random.default_rng(8))
    prog = NativeProgram(program)
    strided = [torch.stack([to_torch(data[n], b.dtype)] * 2, 1)[:, 0] for n, b in prog.spec.items()]
    assert not strided[1].is_contiguous()
    want = simulate(program, data)
    for g, name in zip(prog.run(strided), program.outputs):
        np.testing.assert_array_equal(as_f64(g), as_f64(want[name]))


def test_inputs_taken_as_they_are_or_copied_give_the_same_results():
    """run() hands a contiguous, aligned tensor of the right shape and dtype to the kernels by
    its pointer, and anything else (a view 4 bytes off alignment, a Parameter, one that requires
    grad, a tuple of them) through the checked, copying path: every form gives the same result."""
    program = C.mask_ops(7)
    data = random_inputs(program, np.random.default_rng(8))
    prog = NativeProgram(program)
    plain = [to_torch(data[n], b.dtype) for n, b in prog.spec.items()]
    want = [as_f64(t) for t in prog.run(plain)]
    shifted = [torch.cat([t[:1], t])[1:] for t in plain]
    assert any(t.data_ptr() % 16 for t in shifted)
    floats = [t.requires_grad_() if t.is_floating_point() else t for t in (x.clone() for x in plain)]
    params = [torch.nn.Parameter(t.clone(), requires_grad=False) for t in plain]
    for given in (shifted, floats, params, tuple(plain)):
        for g, w in zip(prog.run(given), want):
            np.testing.assert_array_equal(as_f64(g.detach()), w)


def test_an_input_no_kernel_reads_is_still_checked():
    import strata
    program = strata.compile(lambda x, y: x * 2, (torch.ones(5), torch.ones(3)), device="cpu")
    assert torch.equal(program(torch.arange(5.0), torch.zeros(3)), torch.arange(5.0) * 2)
    with pytest.raises(InputMismatch, match="input 'y' has shape"):
        program(torch.arange(5.0), torch.zeros(4))


def test_0d_output_keeps_shape():
    program = C.row_reduce(1, 1009, "f32", "sum", out_shape=())
    compare(program, random_inputs(program, np.random.default_rng(9), "exact"))


def test_empty_buffers_compile_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(cc, "compile_shared", lambda *a: calls.append(a))
    prog = NativeProgram(C.empty_program())
    [out] = prog.run([torch.zeros(0, 5)])
    assert out.shape == (0, 5) and calls == [] and prog.threads == 1


def test_wrong_inputs_are_one_sentence():
    prog = NativeProgram(C.row_reduce(3, 7, "f32", "sum"))
    with pytest.raises(InputMismatch, match="input 'x' has shape"):
        prog.run([torch.zeros(3, 8)])
    with pytest.raises(InputMismatch, match="expected 1 inputs"):
        prog.run([])


def test_refused_kernels_fail_before_compiling(monkeypatch):
    monkeypatch.setattr(cc, "compile_shared", lambda *a: pytest.fail("compiled"))
    with pytest.raises(CompileError, match=r"k_rms_norm_reduce has block=256"):
        NativeProgram(B.rms_norm(rows=2, cols=256))


def test_compiler_errors_carry_the_log():
    with pytest.raises(CompileError, match=r"rejected the generated C:\n.*error"):
        cc.compile_shared("this is not C;\n", cc.find_compiler())


def test_no_compiler_says_install_gcc(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DeviceUnavailable, match="install gcc") as err:
        cc.find_compiler()
    assert "\n" not in str(err.value)
    monkeypatch.setenv("CC", "no-such-cc -O1")
    with pytest.raises(DeviceUnavailable, match="no-such-cc is not an executable"):
        cc.find_compiler()


def test_omp_num_threads_is_respected(tmp_path):
    lib = tmp_path / "k.so"
    lib.write_bytes(native_build.build_library(NativeProgram(C.mask_ops(7)).source))
    code = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).strata_num_threads())"
    for n in ("1", "3"):
        out = subprocess.run([sys.executable, "-c", code, str(lib)], capture_output=True,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": n}, check=True)
        assert out.stdout.strip() == n
    assert NativeProgram(C.mask_ops(7)).threads >= 1


# ---------------------------------------------------------------- the compile cache

@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("STRATA_CACHE_DIR", str(d))
    monkeypatch.delenv("STRATA_NO_CACHE", raising=False)
    return d / "native"


@pytest.fixture
def compiles(monkeypatch):
    """The list of compiles made (cc.compile_shared calls), counted by patching it."""
    calls = []
    real = cc.compile_shared

    def counting(source, cmd):
        calls.append(source)
        return real(source, cmd)
    monkeypatch.setattr(cc, "compile_shared", counting)
    return calls


def test_a_second_program_compiles_nothing(cache_dir, compiles):
    program = C.row_reduce(3, 7, "f32", "sum")
    x = torch.arange(21, dtype=torch.float32).reshape(3, 7)
    first = NativeProgram(program).run([x])[0]
    second = NativeProgram(program).run([x])[0]
    assert len(compiles) == 1 and torch.equal(first, second)
    [entry] = cache_dir.glob("*.native")
    assert cache.check_entry(entry.read_bytes(), entry.stem)[0] is not None
    assert not list(cache_dir.glob(".*"))            # private load copies are unlinked


def test_keys_follow_flags_and_compiler(cache_dir, compiles, monkeypatch):
    src = NativeProgram(C.mask_ops(7)).source
    cmd = cc.find_compiler()
    key = native_build.cache_key(src, cmd)
    monkeypatch.setattr(cc, "FLAGS", (*cc.FLAGS, "-fno-unroll-loops"))
    assert native_build.cache_key(src, cmd) != key
    assert native_build.cache_key(src, [*cmd, "-m64"]) != native_build.cache_key(src, cmd)
    NativeProgram(C.mask_ops(7))
    assert len(compiles) == 2                        # the one above and the new flags


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "flipped"])
def test_a_damaged_entry_is_rebuilt(damage, cache_dir, compiles, caplog):
    program = C.row_reduce(3, 7, "f32", "max")
    NativeProgram(program)
    [entry] = cache_dir.glob("*.native")
    data = entry.read_bytes()
    entry.write_bytes({"truncated": data[:len(data) // 2], "garbage": b"\x7fELF" + b"x" * 999,
                       "empty": b"", "flipped": data[:-9] + bytes([data[-9] ^ 1]) + data[-8:]}[damage])
    x = torch.rand(3, 7)
    out = NativeProgram(program).run([x])[0]
    assert len(compiles) == 2 and torch.equal(out, x.amax(1))
    assert "corrupt kernel cache entry" in caplog.text
    assert cache.check_entry(entry.read_bytes(), entry.stem)[0] is not None


@pytest.mark.parametrize("cached", [True, False])
def test_a_build_started_early_is_awaited_not_repeated(cache_dir, compiles, monkeypatch, cached):
    """build_soon (models/decode.py: gcc builds the prefill while the step lowers) and the
    program's own build are one compile, with or without the persistent cache."""
    if not cached:
        monkeypatch.setenv("STRATA_NO_CACHE", "1")
    program = C.row_reduce(3, 7, "f32", "sum")
    from strata.codegen.c import emit_program
    source = emit_program(program)
    native_build.build_soon(source)
    x = torch.rand(3, 7)
    assert torch.allclose(NativeProgram(program, source=source).run([x])[0], x.sum(1))
    assert compiles == [source] and not native_build._SOON


def test_no_cache_compiles_every_time(cache_dir, compiles, monkeypatch):
    monkeypatch.setenv("STRATA_NO_CACHE", "1")
    NativeProgram(C.mask_ops(7))
    NativeProgram(C.mask_ops(7))
    assert len(compiles) == 2 and not list(cache_dir.glob("*.native"))


def test_concurrent_processes_leave_one_sound_entry(cache_dir, tmp_path):
    src = emit_program(C.rms_norm_rows(4, 33, "bf16"))
    results = race(tmp_path, src, 4, "from strata.runtime import cc, native_build",
                   "native_build.build_library(src)", "cc.COMPILES")
    assert sum(c for c, _ in results) >= 1
    assert len({d for _, d in results}) == 1        # builds are reproducible: identical entries
    [entry] = cache_dir.glob("*.native")
    assert not [f for f in cache_dir.iterdir() if f != entry]       # no temp files left
    image, why = cache.check_entry(entry.read_bytes(), entry.stem)
    assert image is not None, why
    assert hashlib.sha256(image).hexdigest() in {d for _, d in results}
    assert native_build.load_library(image).strata_num_threads() >= 1


def test_a_16_bit_copy_moves_its_bits():
    """A bf16 value stored as it was loaded (a transposing copy) is moved, not widened and
    rounded back: NaN payloads, -0.0 and subnormals come out bit for bit, as from torch."""
    import strata
    words = [0x7FC1, 0x8000, 0x0001, 0x7F80, 0xFF81, 0x3F80, 0x0000, 0x1234] * 6
    x = torch.tensor([w - 65536 if w >= 32768 else w for w in words], dtype=torch.int16)
    x = x.view(torch.bfloat16).reshape(6, 8)

    def copy(t):
        return t.t().contiguous()
    program = strata.compile(copy, (x,), device="cpu")
    assert "st_raw_" in program.lowered.source
    assert torch.equal(program(x).view(torch.int16), copy(x).view(torch.int16))


def test_programs_of_one_weight_share_its_packed_panel():
    """Prefill programs at several lengths pack the same panel from the same weight: the second
    and later take the first's (nothing packed again) and compute as eager; a program given new
    weights packs a panel of its own, and one made after an in-place update takes that one."""
    m = torch.nn.Linear(512, 1024, bias=False).to(torch.bfloat16)
    xs = [torch.randn(rows, 512, dtype=torch.bfloat16) for rows in (32, 64, 100)]
    with torch.no_grad():
        progs = [strata.compile(m, (x,), device="cpu") for x in xs]
        if "p_weight_panel" not in progs[0].runtime.weights:
            pytest.skip("this CPU has no bf16 dot products (AVX512-BF16, AMX): its bf16 linear "
                        "runs the f32 outer form, which packs no weight panel at load")
        panels = [p.runtime.weights["p_weight_panel"] for p in progs]
        assert panels[0] is panels[1] is panels[2]
        assert [p.runtime._taken for p in progs] == [set(), {0}, {0}]
        for p, x in zip(progs, xs):
            torch.testing.assert_close(p(x), m(x), rtol=2e-2, atol=2e-2)
        before = m(xs[0])
        m.weight.mul_(-2)
        progs[1].set_weights({"p_weight": m.weight})
        assert progs[1].runtime.weights["p_weight_panel"] is not panels[0]
        torch.testing.assert_close(progs[1](xs[1]), m(xs[1]), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(progs[0](xs[0]), before, rtol=2e-2, atol=2e-2)  # its own, as given
        later = strata.compile(m, (torch.randn(16, 512, dtype=torch.bfloat16),), device="cpu")
        assert later.runtime.weights["p_weight_panel"] is progs[1].runtime.weights["p_weight_panel"]
