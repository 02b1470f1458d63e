"""Hand-built Kernel IR programs shared by the simulator, CUDA and NVRTC tests.

Each builder returns a KernelProgram written the way the lowering is expected to write it, so
the tests exercise the consumers of Kernel IR without depending on the stages above it."""
from __future__ import annotations

from strata.core import expr as E
from strata.core import scalar_ops
from strata.kernel_ir.ir import (Assign, BlockIdx, Buffer, For, If, Kernel, KernelProgram, Let, Load,
                              LoadVec, Param, ShflXor, Smem, Store, StoreVec, Sync, ThreadIdx)
from strata.core.dtypes import compute_dtype


def V(name, dtype="i64"):
    return E.Var(name, dtype)


def F(value):
    return E.Const(float(value), "f32")


def I(value):
    return E.Const(int(value), "i64")


def fcall(op, *args):
    return E.call(op, *args)


def program(kernel: Kernel, buffers) -> KernelProgram:
    return KernelProgram(list(buffers), [kernel], [b.name for b in buffers if b.kind == "output"])


def global_index(block: int):
    """i = blockIdx.x * block + threadIdx.x"""
    return Let("i", "i64", E.add(E.mul(BlockIdx(), block), ThreadIdx()))


def elementwise(n: int, dtype: str = "f32", out_dtype: str | None = None, block: int = 256,
                op: str = "sigmoid") -> KernelProgram:
    """out[i] = op(x[i]) * 2 + y[i] with a predicated tail: `if (i < n)`."""
    out_dtype = out_dtype or dtype
    c = compute_dtype(dtype)
    grid = -(-n // block)
    i = V("i")
    body = (
        global_index(block),
        If(E.call("lt", i, I(n)), (
            Let("a", c, Load("x", i, c)),
            Let("b", c, Load("y", i, c)),
            Let("v0", c, fcall(op, V("a", c))),
            Let("v1", c, fcall("add", fcall("multiply", V("v0", c), F(2.0)), V("b", c))),
            Store("out", i, V("v1", c)),
        )),
    )
    params = (Param("x", dtype, n), Param("y", dtype, n), Param("out", out_dtype, n, output=True))
    k = Kernel(f"k_ew_{op}", params, grid, block, body, src="sigmoid(x) * 2 + y")
    bufs = [Buffer("x", dtype, (n,), "input"), Buffer("y", dtype, (n,), "input"),
            Buffer("out", out_dtype, (n,), "output")]
    return program(k, bufs)


def copy(n: int, dtype: str, block: int = 128) -> KernelProgram:
    """out[i] = x[i]: a load/store round trip through the compute dtype."""
    c = compute_dtype(dtype)
    i = V("i")
    body = (global_index(block),
            If(E.call("lt", i, I(n)), (Let("v", c, Load("x", i, c)), Store("out", i, V("v", c)))))
    k = Kernel(f"k_copy_{dtype}", (Param("x", dtype, n), Param("out", dtype, n, output=True)),
               -(-n // block), block, body)
    return program(k, [Buffer("x", dtype, (n,), "input"), Buffer("out", dtype, (n,), "output")])


def vector_scale(n: int, dtype: str = "f32", width: int = 4, block: int = 128,
                 misalign: int = 0) -> KernelProgram:
    """out[w*j .. w*j+w) = x[w*j .. w*j+w) * 3 with one vector load and one vector store per thread.

    `misalign` shifts the load index by that many elements (for the sanitizer test)."""
    assert n % width == 0
    c = compute_dtype(dtype)
    nv = n // width
    j, base = V("j"), V("base")
    names = tuple(f"x{k}" for k in range(width))
    body = (
        Let("j", "i64", E.add(E.mul(BlockIdx(), block), ThreadIdx())),
        If(E.call("lt", j, I(nv)), (
            Let("base", "i64", E.mul(j, width)),
            LoadVec(names, "x", E.add(base, misalign), c),
            StoreVec("out", base, tuple(fcall("multiply", V(nm, c), F(3.0) if c[0] == "f" else I(3))
                                        for nm in names)),
        )),
    )
    k = Kernel(f"k_vec{width}_{dtype}", (Param("x", dtype, n), Param("out", dtype, n, output=True)),
               -(-nv // block), block, body)
    return program(k, [Buffer("x", dtype, (n,), "input"), Buffer("out", dtype, (n,), "output")])


def rms_norm(rows: int = 32, cols: int = 2048, block: int = 256, eps: float = 1e-6,
             dtype: str = "f32", tree_guard: str = "thread") -> KernelProgram:
    """The seed's k_rms_norm_reduce: one block per row, x staged in smem, a strided sum of
    squares, a warp shuffle butterfly, then a shared-memory tree across the warps.

    tree_guard="warp" reproduces the seed listing literally (`if (warp < s)`), where all 32 lanes
    of a warp read and write the same smem element between barriers: a race (benign on hardware
    because they write equal values, but a race) that the sanitizer must report. The default
    guards the tree with the thread index (`if (a0 < s)`), one writer per element."""
    f = compute_dtype(dtype)
    nwarps = block // 32
    a0, a1, lane, warp = V("a0", "i32"), V("a1", "i32"), V("lane", "i32"), V("warp", "i32")
    fv = lambda n: V(n, f)  # noqa: E731
    flat = V("x_smem_flat", "i32")
    body = [
        Let("v0", f, fcall("reciprocal", F(cols))),
        Let("a1", "i32", BlockIdx()),
        Let("a0", "i32", ThreadIdx()),
        Let("lane", "i32", E.mod(a0, 32)),
        Let("warp", "i32", E.floordiv(a0, 32)),
        Let("acc0", f, F(0.0)),
        Smem("x_smem", "f32", cols),
        For("x_smem_flat", a0, I(cols), block, (
            Let("x_smem_v", f, Load("x", E.add(E.mul(a1, cols), flat), f)),
            Store("x_smem", flat, fv("x_smem_v")),
        )),
        Sync(),
        For("a2", a0, I(cols), block, (
            Let("in2", f, Load("x_smem", V("a2", "i32"), f)),
            Let("v1", f, fcall("multiply", fv("in2"), fv("in2"))),
            Assign("acc0", fcall("add", fv("acc0"), fv("v1"))),
        )),
        Let("acc0_w", f, fv("acc0")),
    ]
    m = 16
    while m >= 1:
        body.append(Assign("acc0_w", fcall("add", fv("acc0_w"), ShflXor(fv("acc0_w"), m, f))))
        m //= 2
    body += [
        Smem("acc0_smem", "f32", nwarps),
        If(E.call("eq", lane, I(0)), (Store("acc0_smem", warp, fv("acc0_w")),)),
        Sync(),
    ]
    who = a0 if tree_guard == "thread" else warp
    s = nwarps // 2
    while s >= 1:
        body += [
            If(E.call("lt", who, I(s)), (
                Store("acc0_smem", who, fcall("add", Load("acc0_smem", who, f),
                                              Load("acc0_smem", E.add(who, s), f))),
            )),
            Sync(),
        ]
        s //= 2
    body += [
        Let("acc0_b", f, Load("acc0_smem", I(0), f)),
        Let("v2", f, fcall("multiply", fv("acc0_b"), fv("v0"))),
        Let("v3", f, fcall("add", fv("v2"), F(eps))),
        Let("v4", f, fcall("rsqrt", fv("v3"))),
        For("a2", a0, I(cols), block, (
            Let("in3", f, Load("x_smem", V("a2", "i32"), f)),
            Let("in4", f, Load("p_weight", V("a2", "i32"), f)),
            Let("v5", f, fcall("multiply", fv("in3"), fv("v4"))),
            Let("v6", f, fcall("multiply", fv("v5"), fv("in4"))),
            Store("rms_norm", E.add(E.mul(a1, cols), V("a2", "i32")), fv("v6")),
        )),
    ]
    params = (Param("x", dtype, rows * cols), Param("p_weight", dtype, cols),
              Param("rms_norm", dtype, rows * cols, output=True))
    k = Kernel("k_rms_norm_reduce", params, rows, block, tuple(body), src="RMSNorm(2048)")
    bufs = [Buffer("x", dtype, (1, rows, cols), "input"), Buffer("p_weight", dtype, (cols,), "weight"),
            Buffer("rms_norm", dtype, (1, rows, cols), "output")]
    return program(k, bufs)


def _zoo_ops(dtype: str) -> list[str]:
    """The scalar ops of the table that values of `dtype` support (cast aside)."""
    floating = compute_dtype(dtype).startswith("f")
    return [name for name, op in scalar_ops.OPS.items()
            if name != "cast" and (op.c_float if floating else op.c_int is not None)]


def _zoo_value(name: str, a, b, c: str):
    """op(a, b) with the operands `name` needs, cast back to the compute type `c`."""
    if name == "exp_shifted":             # its argument is a softmax's x - max: never above 0
        val = fcall(name, fcall("negative", fcall("abs", a)))
    elif scalar_ops.get(name).arity == 1:
        val = fcall(name, a)
    elif name == "where":
        val = fcall("where", fcall("lt", a, b), a, b)
    elif name == "fma":
        val = fcall("fma", a, b, a)
    elif name in ("logical_and", "logical_or", "logical_xor"):
        val = fcall(name, fcall("gt", a, b), fcall("ne", a, b))
    else:
        val = fcall(name, a, b)
    return val if val.dtype == c else E.Cast(val, c)


def scalar_op_zoo(dtype: str = "f32", n: int = 256, block: int = 128) -> tuple[KernelProgram, list[str]]:
    """Every scalar op of the table that `dtype` supports, applied to loaded values:
    out[k * n + i] = op_k(a[i], b[i][, c]) (bool results cast back to `dtype`).

    Returns the program and the op names in slot order."""
    c = compute_dtype(dtype)
    i = V("i")
    a, b = V("a", c), V("b", c)
    ops = _zoo_ops(dtype)
    stmts = [Store("out", E.add(i, k * n), _zoo_value(name, a, b, c)) for k, name in enumerate(ops)]
    body = (global_index(block),
            If(E.call("lt", i, I(n)), (Let("a", c, Load("x", i, c)), Let("b", c, Load("y", i, c)),
                                       *stmts)))
    params = (Param("x", dtype, n), Param("y", dtype, n), Param("out", dtype, n * len(ops), output=True))
    k = Kernel(f"k_zoo_{dtype}", params, -(-n // block), block, body)
    bufs = [Buffer("x", dtype, (n,), "input"), Buffer("y", dtype, (n,), "input"),
            Buffer("out", dtype, (len(ops), n), "output")]
    return program(k, bufs), ops


def scalar_op_kernels(dtype: str = "f32", n: int = 256, block: int = 128) -> KernelProgram:
    """The zoo with one kernel per op, `k_op_<name>`: out[i] = op(x[i], y[i]), so that what a
    compiler makes of each op can be told apart (one PTX .entry per op)."""
    c = compute_dtype(dtype)
    i = V("i")
    a, b = V("a", c), V("b", c)
    params = (Param("x", dtype, n), Param("y", dtype, n), Param("out", dtype, n, output=True))
    kernels = [Kernel(f"k_op_{name}", params, -(-n // block), block, (
        global_index(block),
        If(E.call("lt", i, I(n)), (Let("a", c, Load("x", i, c)), Let("b", c, Load("y", i, c)),
                                   Store("out", i, _zoo_value(name, a, b, c))))))
        for name in _zoo_ops(dtype)]
    bufs = [Buffer("x", dtype, (n,), "input"), Buffer("y", dtype, (n,), "input"),
            Buffer("out", dtype, (n,), "output")]
    return KernelProgram(bufs, kernels, ["out"])


def special_constants(n: int = 64) -> KernelProgram:
    """out = [max(x, -inf), min(x, inf), isnan(x) ? nan : x]: INFINITY and NAN in the source."""
    i, a = V("i"), V("a", "f32")
    body = (global_index(n), Let("a", "f32", Load("x", i, "f32")),
            Store("out", i, fcall("maximum", a, F(float("-inf")))),
            Store("out", E.add(i, n), fcall("minimum", a, F(float("inf")))),
            Store("out", E.add(i, 2 * n), fcall("where", fcall("isnan", a), F(float("nan")), a)))
    k = Kernel("k_specials", (Param("x", "f32", n), Param("out", "f32", 3 * n, output=True)), 1, n, body)
    return program(k, [Buffer("x", "f32", (n,), "input"), Buffer("out", "f32", (3, n), "output")])
