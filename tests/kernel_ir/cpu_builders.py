"""Hand-built Kernel IR programs with one thread per block (block=1), as a CPU schedule writes them.

The C target (strata/codegen/c.py) runs only such kernels: a block is one iteration of an OpenMP
loop, so a block walks its elements or its row with `For` loops instead of threads. Each builder
returns a KernelProgram the simulator also runs, so the native and simulated results compare."""
from __future__ import annotations

from kernel_builders import F, I, V, _zoo_ops, _zoo_value, fcall

from strata.core import expr as E
from strata.core import scalar_ops
from strata.core.dtypes import compute_dtype, is_float
from strata.kernel_ir.ir import (Assign, BlockIdx, Buffer, For, Kernel, KernelProgram, Let, Load,
                              LoadVec, Param, Store, StoreVec)


def _elements(n: int, chunk: int | None, body) -> tuple[int, tuple]:
    """(grid, statements) running body(i) for i < n: one element per block (chunk None), else a
    block per `chunk` elements, `for (i = b * chunk; i < min(b * chunk + chunk, n); i++)`."""
    i = V("i")
    if chunk is None:
        return n, (Let("i", "i64", BlockIdx()), *body(i))
    start = E.mul(BlockIdx(), chunk)
    stop = E.call("minimum", E.add(start, chunk), I(n))
    return -(-n // chunk), (For("i", start, stop, 1, tuple(body(i)), dtype="i64"),)


def _load(name: str, index, dtype: str):
    return Load(name, index, compute_dtype(dtype))


def op_outputs(dtype: str, n: int, chunk: int | None = None) -> tuple[KernelProgram, list[str]]:
    """One kernel `k_op_<name>` per scalar op `dtype` supports: out_<name>[i] = op(x[i], y[i])
    (bool results cast back to `dtype`). Returns the program and the op names."""
    c = compute_dtype(dtype)
    ops = _zoo_ops(dtype)
    kernels = []
    for name in ops:
        def body(i, name=name):
            return (Let("a", c, Load("x", i, c)), Let("b", c, Load("y", i, c)),
                    Store(f"out_{name}", i, _zoo_value(name, V("a", c), V("b", c), c)))
        grid, stmts = _elements(n, chunk, body)
        params = (Param("x", dtype, n), Param("y", dtype, n),
                  Param(f"out_{name}", dtype, n, output=True))
        kernels.append(Kernel(f"k_op_{name}", params, grid, 1, stmts, src=f"{name}(x, y)"))
    bufs = [Buffer("x", dtype, (n,), "input"), Buffer("y", dtype, (n,), "input"),
            *(Buffer(f"out_{name}", dtype, (n,), "output") for name in ops)]
    return KernelProgram(bufs, kernels, [f"out_{name}" for name in ops]), ops


def row_reduce(rows: int, cols: int, dtype: str = "f32", op: str = "sum",
               out_shape: tuple | None = None) -> KernelProgram:
    """out[r] = op over x[r, :] (sum, prod, max, min, argmax, argmin), one row per block, the
    accumulator in the compute type (argmax: the first index of the max, NaN counting as max)."""
    c = compute_dtype(dtype)
    row, col = BlockIdx(), V("c")
    v, acc = V("v", c), V("acc", c)
    load = Let("v", c, Load("x", E.add(E.mul(row, cols), col), c))
    if op in ("argmax", "argmin"):
        better = "gt" if op == "argmax" else "lt"
        take = fcall(better, v, acc)
        if is_float(c):
            vn, an = fcall("isnan", v), fcall("isnan", acc)
            take = fcall("logical_or", fcall("logical_and", vn, fcall("logical_not", an)),
                         fcall("logical_and", fcall("logical_not", an), take))
        init = [Let("acc", c, E.Const(scalar_ops.reduce_identity(op, c), c)),
                Let("acc_i", "i64", I(0))]
        update = (load, Let("take", "bool", take),
                  Assign("acc", fcall("where", V("take", "bool"), v, acc)),
                  Assign("acc_i", fcall("where", V("take", "bool"), col, V("acc_i"))))
        result, out_dtype = V("acc_i"), "i64"
    else:
        init = [Let("acc", c, E.Const(scalar_ops.reduce_identity(op, c), c))]
        update = (load, Assign("acc", fcall(scalar_ops.REDUCE_COMBINE[op], acc, v)))
        result, out_dtype = acc, dtype
    body = (*init, For("c", I(0), I(cols), 1, update, dtype="i64"), Store("out", row, result))
    params = (Param("x", dtype, rows * cols), Param("out", out_dtype, rows, output=True))
    k = Kernel(f"k_{op}_rows", params, rows, 1, body, src=f"aten.{op} @ <snippet>:1")
    shape = out_shape if out_shape is not None else (rows,)
    return KernelProgram([Buffer("x", dtype, (rows, cols), "input"),
                          Buffer("out", out_dtype, shape, "output")], [k], ["out"])


def rms_norm_rows(rows: int, cols: int, dtype: str = "f32", eps: float = 1e-6) -> KernelProgram:
    """RMSNorm with one row per block: a sum of squares (a reduction loop), then a loop that
    stores x * rsqrt(mean + eps) * w (an independent store loop)."""
    c = compute_dtype(dtype)
    row, col = BlockIdx(), V("c")
    at = E.add(E.mul(row, cols), col)
    body = (
        Let("acc", c, F(0.0)),
        For("c", I(0), I(cols), 1, (
            Let("v", c, Load("x", at, c)),
            Assign("acc", fcall("add", V("acc", c), fcall("multiply", V("v", c), V("v", c)))),
        ), dtype="i64"),
        Let("scale", c, fcall("rsqrt", fcall("add", fcall("multiply", V("acc", c), F(1.0 / cols)),
                                             F(eps)))),
        For("c", I(0), I(cols), 1, (
            Let("v2", c, Load("x", at, c)),
            Let("w", c, Load("weight", col, c)),
            Store("out", at, fcall("multiply", fcall("multiply", V("v2", c), V("scale", c)),
                                   V("w", c))),
        ), dtype="i64"),
    )
    params = (Param("x", dtype, rows * cols), Param("weight", dtype, cols),
              Param("out", dtype, rows * cols, output=True))
    k = Kernel("k_rms_norm", params, rows, 1, body, src="aten.rms_norm @ <snippet>:1")
    return KernelProgram([Buffer("x", dtype, (rows, cols), "input"),
                          Buffer("weight", dtype, (cols,), "weight"),
                          Buffer("out", dtype, (rows, cols), "output")], [k], ["out"])


def vector_scale(n: int, dtype: str = "f32", width: int = 4) -> KernelProgram:
    """out[w*j .. w*j+w) = x[w*j .. w*j+w) * 3 by vector loads/stores, one vector per block."""
    c = compute_dtype(dtype)
    names = tuple(f"x{k}" for k in range(width))
    three = F(3.0) if is_float(c) else I(3)
    body = (Let("base", "i64", E.mul(BlockIdx(), width)),
            LoadVec(names, "x", V("base"), c),
            StoreVec("out", V("base"), tuple(fcall("multiply", V(nm, c), three) for nm in names)))
    k = Kernel(f"k_vec{width}_{dtype}", (Param("x", dtype, n), Param("out", dtype, n, output=True)),
               n // width, 1, body)
    return KernelProgram([Buffer("x", dtype, (n,), "input"), Buffer("out", dtype, (n,), "output")],
                         [k], ["out"])


def mask_ops(n: int, chunk: int | None = None) -> KernelProgram:
    """Bool buffers: flip[i] = m[i] xor (x[i] > 0.5), sel[i] = where(m[i], x[i], -x[i]),
    as_f[i] = float(m[i]) + float(x[i] > y[i] && !m[i])."""
    m, x, y = V("m", "bool"), V("a", "f32"), V("b", "f32")

    def body(i):
        return (Let("m", "bool", Load("mask", i, "bool")), Let("a", "f32", Load("x", i, "f32")),
                Let("b", "f32", Load("y", i, "f32")),
                Store("flip", i, fcall("logical_xor", m, fcall("gt", x, F(0.5)))),
                Store("sel", i, fcall("where", m, x, fcall("negative", x))),
                Store("as_f", i, fcall("add", E.Cast(m, "f32"), E.Cast(fcall(
                    "logical_and", fcall("gt", x, y), fcall("logical_not", m)), "f32"))))
    grid, stmts = _elements(n, chunk, body)
    params = (Param("mask", "bool", n), Param("x", "f32", n), Param("y", "f32", n),
              Param("flip", "bool", n, output=True), Param("sel", "f32", n, output=True),
              Param("as_f", "f32", n, output=True))
    k = Kernel("k_mask_ops", params, grid, 1, stmts)
    return KernelProgram([Buffer("mask", "bool", (n,), "input"), Buffer("x", "f32", (n,), "input"),
                          Buffer("y", "f32", (n,), "input"), Buffer("flip", "bool", (n,), "output"),
                          Buffer("sel", "f32", (n,), "output"), Buffer("as_f", "f32", (n,), "output")],
                         [k], ["flip", "sel", "as_f"])


def two_kernels_in_place(n: int, chunk: int = 64) -> KernelProgram:
    """t = x * 2 (a temp), out = t + y, then cache += out (an input updated in place, returned
    second): three kernels, a slab temp and a mutated input."""
    f = "f32"

    def scale(i):
        return (Store("t", i, fcall("multiply", _load("x", i, f), F(2.0))),)

    def add(i):
        return (Store("out", i, fcall("add", _load("t", i, f), _load("y", i, f))),)

    def update(i):
        return (Store("cache", i, fcall("add", _load("cache", i, f), _load("out", i, f))),)
    kernels = []
    for name, body, params in (
            ("k_scale", scale, (Param("x", f, n), Param("t", f, n, output=True))),
            ("k_add", add, (Param("t", f, n), Param("y", f, n), Param("out", f, n, output=True))),
            ("k_update", update, (Param("out", f, n), Param("cache", f, n, output=True)))):
        grid, stmts = _elements(n, chunk, body)
        kernels.append(Kernel(name, params, grid, 1, stmts))
    bufs = [Buffer("x", f, (n,), "input"), Buffer("y", f, (n,), "input"),
            Buffer("cache", f, (n,), "input"), Buffer("t", f, (n,), "temp"),
            Buffer("out", f, (n,), "output")]
    return KernelProgram(bufs, kernels, ["out", "cache"])


def empty_program() -> KernelProgram:
    """Empty tensors fold before Kernel IR: buffers of 0 elements and no kernel at all."""
    return KernelProgram([Buffer("x", "f32", (0, 5), "input"),
                          Buffer("out", "f32", (0, 5), "output")], [], ["out"])


def unary_ops(n: int, ops: tuple, chunk: int = 1024) -> KernelProgram:
    """out_<op>[i] = op(x[i]) in f32, a kernel per op."""
    kernels = []
    for op in ops:
        grid, stmts = _elements(n, chunk, lambda i, op=op: (
            Store(f"out_{op}", i, E.call(op, _load("x", i, "f32"))),))
        kernels.append(Kernel(f"k_{op}", (Param("x", "f32", n), Param(f"out_{op}", "f32", n, output=True)),
                              grid, 1, stmts))
    return KernelProgram([Buffer("x", "f32", (n,), "input"),
                          *(Buffer(f"out_{op}", "f32", (n,), "output") for op in ops)],
                         kernels, [f"out_{op}" for op in ops])


def convert(n: int, src: str, dst: str, chunk: int = 1024) -> KernelProgram:
    """out[i] = x[i] stored as `dst`: a load of `src` in its compute type, rounded by the store."""
    def body(i):
        return (Store("out", i, _load("x", i, src)),)
    grid, stmts = _elements(n, chunk, body)
    k = Kernel(f"k_{src}_to_{dst}", (Param("x", src, n), Param("out", dst, n, output=True)),
               grid, 1, stmts)
    return KernelProgram([Buffer("x", src, (n,), "input"), Buffer("out", dst, (n,), "output")],
                         [k], ["out"])
