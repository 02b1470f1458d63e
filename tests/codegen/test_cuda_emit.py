"""The CUDA emitter prints readable, correct C for each Kernel IR construct."""
import sys
from pathlib import Path

import pytest

from strata.core import expr as E
from strata.kernel_ir.ir import (Assign, BlockIdx, Comment, For, If, Kernel, Let, Load, Param, Smem,
                              Store, Sync, ThreadIdx)
from strata.codegen.cfamily import float_literal, int_literal
from strata.codegen.cuda import emit_kernel, emit_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_ir"))
import kernel_builders as B  # noqa: E402

RMS_NORM = '''\
// RMSNorm(2048)
extern "C" __global__ void __launch_bounds__(256)
k_rms_norm_reduce(const float* __restrict__ x, const float* __restrict__ p_weight,
                  float* __restrict__ rms_norm) {
    st_grid_dependency();
    float v0 = 1.0f / 2048.0f;
    int a1 = blockIdx.x;
    int a0 = threadIdx.x;
    int lane = a0 % 32;
    int warp = a0 / 32;
    float acc0 = 0.0f;
    __shared__ float x_smem[2048];
    for (int x_smem_flat = a0; x_smem_flat < 2048; x_smem_flat += 256) {
        float x_smem_v = x[a1 * 2048 + x_smem_flat];
        x_smem[x_smem_flat] = x_smem_v;
    }
    __syncthreads();
    for (int a2 = a0; a2 < 2048; a2 += 256) {
        float in2 = x_smem[a2];
        float v1 = in2 * in2;
        acc0 += v1;
    }
    float acc0_w = acc0;
    acc0_w += __shfl_xor_sync(0xffffffffu, acc0_w, 16);
    acc0_w += __shfl_xor_sync(0xffffffffu, acc0_w, 8);
    acc0_w += __shfl_xor_sync(0xffffffffu, acc0_w, 4);
    acc0_w += __shfl_xor_sync(0xffffffffu, acc0_w, 2);
    acc0_w += __shfl_xor_sync(0xffffffffu, acc0_w, 1);
    __shared__ float acc0_smem[8];
    if (lane == 0) {
        acc0_smem[warp] = acc0_w;
    }
    __syncthreads();
    if (a0 < 4) {
        acc0_smem[a0] = acc0_smem[a0] + acc0_smem[a0 + 4];
    }
    __syncthreads();
    if (a0 < 2) {
        acc0_smem[a0] = acc0_smem[a0] + acc0_smem[a0 + 2];
    }
    __syncthreads();
    if (a0 < 1) {
        acc0_smem[a0] = acc0_smem[a0] + acc0_smem[a0 + 1];
    }
    __syncthreads();
    float acc0_b = acc0_smem[0];
    float v2 = acc0_b * v0;
    float v3 = v2 + 1e-06f;
    float v4 = rsqrtf(v3);
    for (int a2 = a0; a2 < 2048; a2 += 256) {
        float in3 = x_smem[a2];
        float in4 = p_weight[a2];
        float v5 = in3 * v4;
        float v6 = v5 * in4;
        rms_norm[a1 * 2048 + a2] = v6;
    }
}'''


def test_rms_norm_reads_like_the_seed():
    text = emit_kernel(B.rms_norm().kernels[0])
    assert text == RMS_NORM
    for piece in ('extern "C" __global__', "__launch_bounds__(256)", "__shfl_xor_sync(0xffffffffu",
                  "__syncthreads();", "__shared__ float x_smem[2048];"):
        assert piece in text


def test_program_has_headers_prelude_and_every_kernel():
    prog = B.rms_norm()
    prog.kernels.append(B.elementwise(100).kernels[0])
    src = emit_program(prog, "sm_80")
    assert src.startswith("// strata: 2 kernel(s) for sm_80: k_rms_norm_reduce, k_ew_sigmoid")
    for piece in ("#include <cuda_fp16.h>", "#include <cuda_bf16.h>", "float st_max(", "float st_min(",
                  "float st_sign(", "float st_fmod(", "k_rms_norm_reduce(", "k_ew_sigmoid("):
        assert piece in src
    assert src.index("st_fmod") < src.index("k_rms_norm_reduce(")


@pytest.mark.parametrize("value,dtype,text", [
    (1e-6, "f32", "1e-06f"), (2048, "f32", "2048.0f"), (0.1, "f32", "0.1f"), (-2.5, "f32", "-2.5f"),
    (1e20, "f32", "1e+20f"), (float("inf"), "f32", "INFINITY"), (float("-inf"), "f32", "-INFINITY"),
    (float("nan"), "f32", "NAN"), (0.1, "f64", "0.1"), (3.0, "f64", "3.0"), (0.0, "f32", "0.0f")])
def test_float_literals(value, dtype, text):
    assert float_literal(value, dtype) == text


def test_int_literals():
    assert int_literal(5, "i64") == "5"
    assert int_literal(-7, "i64") == "-7"
    assert int_literal(1 << 40, "i64") == "1099511627776LL"
    assert int_literal(1, "bool") == "true"


def kernel(body, params=(Param("x", "f32", 64), Param("out", "f32", 64, True)), grid=1, block=64):
    return emit_kernel(Kernel("k_t", tuple(params), grid, block, tuple(body)))


def test_indices_are_int_and_become_long_long_past_2_31():
    small = kernel([B.global_index(64), Store("out", B.V("i"), B.F(1))])
    assert "    int i = blockIdx.x * 64 + threadIdx.x;" in small
    n = 3 << 30
    big = emit_kernel(B.elementwise(n).kernels[0])
    assert "long long i = (long long)blockIdx.x * 256 + threadIdx.x;" in big
    assert f"if (i < {n}LL) {{" in big


def test_integer_data_keeps_its_type():
    params = (Param("ids", "i64", 64), Param("out", "i64", 64, True))
    text = kernel([Let("t", "i64", ThreadIdx()), Let("v", "i64", Load("ids", B.V("t"), "i64")),
                   Let("w", "i64", E.call("add", B.V("v"), B.I(1))), Store("out", B.V("t"), B.V("w"))],
                  params)
    assert "int t = threadIdx.x;" in text
    assert "long long v = ids[t];" in text and "long long w = v + 1;" in text


def test_thread_index_is_signed_under_subtraction():
    text = kernel([Let("d", "i64", E.sub(ThreadIdx(), 1)),
                   If(E.call("ge", B.V("d"), B.I(0)), (Store("out", B.V("d"), B.F(1)),))])
    assert "int d = (int)threadIdx.x - 1;" in text


def test_casts():
    a = B.V("a", "f32")
    text = kernel([Let("a", "f32", Load("x", ThreadIdx(), "f32")),
                   Let("n", "i32", E.Cast(a, "i32")),
                   Let("b", "bool", E.Cast(a, "bool")),
                   Let("h", "f32", E.Cast(a, "bf16")),
                   Let("g", "f32", E.Cast(B.V("n", "i32"), "f32"))])
    assert "int n = (int)a;" in text
    assert "bool b = a != 0.0f;" in text
    assert "float h = __bfloat162float(__float2bfloat16_rn(a));" in text
    assert "float g = (float)n;" in text


def test_half_conversions_at_loads_and_stores():
    text = emit_kernel(B.copy(100, "f16").kernels[0])
    assert "float v = __half2float(x[i]);" in text and "out[i] = __float2half_rn(v);" in text
    assert "const __half* __restrict__ x" in text
    text = emit_kernel(B.copy(100, "bf16").kernels[0])
    assert "float v = __bfloat162float(x[i]);" in text and "out[i] = __float2bfloat16_rn(v);" in text


def test_vector_accesses():
    f32 = emit_kernel(B.vector_scale(1024, "f32", 4).kernels[0])
    assert "const float4 x0_v4 = *reinterpret_cast<const float4*>(&x[base]);" in f32
    assert "*reinterpret_cast<float4*>(&out[base]) = make_float4(" in f32
    f16 = emit_kernel(B.vector_scale(1024, "f16", 8).kernels[0])
    assert "const uint4 x0_v8 = *reinterpret_cast<const uint4*>(&x[base]);" in f16
    assert "float x7 = __high2float(x0_v8_h2[3]);" in f16
    assert "out_v8_h2[3] = __floats2half2_rn(x6 * 3.0f, x7 * 3.0f);" in f16
    bf16 = emit_kernel(B.vector_scale(1024, "bf16", 2).kernels[0])
    assert "reinterpret_cast<const __nv_bfloat162*>" in bf16
    assert "*reinterpret_cast<__nv_bfloat162*>(&out[base]) = __floats2bfloat162_rn(" in bf16


def test_control_flow_pragmas_comments_and_else_if():
    t = B.V("t")
    text = kernel([Comment("two ways"), Let("t", "i64", ThreadIdx()), Let("acc", "f32", B.F(0)),
                   For("k", B.I(0), B.I(4), 1, (Assign("acc", E.call("add", B.V("acc", "f32"),
                                                                      B.F(float("inf")))),), unroll=True),
                   If(E.call("lt", t, B.I(8)), (Store("out", t, B.V("acc", "f32")),),
                      (If(E.call("lt", t, B.I(16)), (Store("out", t, B.F(float("nan"))),),
                          (Store("out", t, B.F(-1.5)),)),))])
    assert "    // two ways\n" in text
    assert "    #pragma unroll\n    for (int k = 0; k < 4; k++) {\n        acc += INFINITY;" in text
    assert "} else if (t < 16) {" in text and "} else {" in text and "out[t] = -1.5f;" in text


def test_names_that_clash_with_c_are_renamed():
    params = (Param("float", "f32", 64), Param("max", "f32", 64, True))
    text = kernel([Let("int", "i64", ThreadIdx()),
                   Store("max", B.V("int"), E.call("maximum", Load("float", B.V("int"), "f32"), B.F(0)))],
                  params)
    assert "const float* __restrict__ float_" in text and "int int_ = threadIdx.x;" in text
    assert "max_[int_] = st_max(float_[int_], 0.0f);" in text


def test_nested_shared_arrays_are_declared_at_the_top():
    t = B.V("t")
    text = kernel([Let("t", "i64", ThreadIdx()),
                   For("k", B.I(0), B.I(2), 1, (Smem("s", "f32", 64), Store("s", t, B.F(1)), Sync())),
                   Store("out", t, Load("s", t, "f32"))])
    lines = text.splitlines()
    assert lines[2] == "    __shared__ float s[64];" and text.count("__shared__") == 1


def test_scalar_op_templates_get_their_arguments_parenthesised():
    a, b = B.V("a", "f32"), B.V("b", "f32")
    text = kernel([Let("a", "f32", B.F(1)), Let("b", "f32", B.F(2)),
                   Let("c", "f32", E.call("square", E.call("add", a, b))),
                   Let("d", "f32", E.call("sigmoid", E.call("subtract", a, b))),
                   Let("e", "f32", E.call("exp", E.call("add", a, b))),
                   Let("f", "f32", E.call("multiply", E.call("add", a, b), E.call("subtract", a, b)))])
    assert "float c = (a + b) * (a + b);" in text
    assert "float d = 1.0f / (1.0f + expf(-(a - b)));" in text
    assert "float e = expf(a + b);" in text
    assert "float f = (a + b) * (a - b);" in text


def test_block_uniform_guard_and_block_idx():
    text = kernel([If(E.call("lt", BlockIdx(), B.I(2)), (Sync(),))], grid=4)
    assert "if (blockIdx.x < 2) {\n        __syncthreads();\n    }" in text
