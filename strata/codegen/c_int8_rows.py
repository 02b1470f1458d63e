"""A QuantRows form (kernel_ir/cpu_ir.py: a group of quantized weight rows by M activation rows)
as a call of preludes/c_int8_rows.h's kernel, where the compiler targets AVX512-VNNI (vpdpbusd)
or AVX2 (vpmaddubsw).

Why a call: the kernel is a fixed micro-kernel (VNNI: 8 weight rows by 32 activation rows a
step; AVX2: 4 by 16; the activation rows as the lanes; strata.bench.quant_prefill) whose only
variables are where the group's bytes and scales start and how far apart its rows are; those
are the QuantRow's own index expressions at the group's first row and the next, so a weight
merged from several projections (its rows offset) needs nothing more. The activations are
quantized once per call before the kernel's parallel region (codegen/c.py, `st_xr_`). The loops
as written (a QuantRow per activation row) are printed under `#else`.
"""
from __future__ import annotations

from ..core.expr import Const, coefficient, substitute
from ..kernel_ir.cpu_ir import BLOCK_LANES, KQ, LANES, QuantRows
from .cfamily import cname, prelude, strip_parens

INT8_ROWS_PRELUDE = prelude("c_int8_rows.h")
PARTS = {"q4_0": ("unsigned char", "uint16_t"), "q8_0": ("signed char", "uint16_t"),
         "q4_k": ("unsigned char", "uint16_t", "unsigned char", "uint16_t", "unsigned char"),
         "q5_k": ("unsigned char", "uint16_t", "unsigned char", "uint16_t", "unsigned char"),
         "q6_k": ("unsigned char", "uint16_t", "signed char")}


def emit_quant_rows(em, form: QuantRows, depth: int, as_written) -> None:
    row = form.row              # (kernel_ir/lower_quant_rows.py made it printable: 16-bit scales,
    loads = (row.qs,) + tuple(s.buf for s in row.vnni)      # the group's rows side by side)
    bf = int(em.bufs[row.vnni[0].buf] == "bf16")
    first = {form.var: 0, form.m: 0, row.var: 0}

    def at(e, values) -> str:
        return strip_parens(em.expr(substitute(e, {v: Const(x, "i64") for v, x in values.items()})))

    def part(buf, index, ctype) -> str:         # the group's first row, and the rows' stride
        p = f"({ctype}*)&{cname(buf)}[{at(index, first)}]"
        return f"{p}, ({at(index, {**first, form.var: 1})}) - ({at(index, first)})"
    indexes = (row.qs_at,) + tuple(s.index for s in row.vnni)
    ptrs = ", ".join(part(b, i, f"const {t}") for b, i, t in zip(loads, indexes, PARTS[row.fmt]))
    k = (row.trip_count or 0) * BLOCK_LANES.get(row.fmt, LANES)
    unpack = {"q4_0": f"st_unpack_q4(&st_g, {k}, {bf}, 0, {ptrs}, 0, 0, 0, 0, 0, 0)",
              "q4_k": f"st_unpack_q4(&st_g, {k}, {bf}, 1, {ptrs})",
              "q5_k": f"st_unpack_q5_k(&st_g, {k}, {bf}, {ptrs})",
              "q8_0": f"st_unpack_q8_0(&st_g, {k}, {bf}, {ptrs})",
              "q6_k": f"st_unpack_q6_k(&st_g, {k}, {bf}, {ptrs})"}[row.fmt]
    ldo = coefficient(form.out_at, form.m)
    em.emit(f"#if ST_VNNI    // {row.fmt} rows by {form.rows} activation rows on int8 dot "
            f"products (codegen/c_int8_rows.py)", 0)
    em.emit("{", depth)
    em.emit("static _Thread_local st_wr8 st_g; static _Thread_local long st_g_k;", depth + 1)
    em.emit(f"if (st_g_k < {k}) {{ if (st_g_k) st_wr8_free(st_g); st_g = st_wr8_new({k}); "
            f"st_g_k = {k}; }}", depth + 1)
    em.emit(f"{unpack};", depth + 1)
    em.emit(f"st_int8_rows_run(&st_xr_{cname(row.x)}, &st_g, {form.rows}, {k}, "
            f"{16 if row.fmt == 'q6_k' else 32}, {int(row.fmt in KQ)}, "
            f"&{cname(form.out)}[{at(form.out_at, first)}], {ldo});", depth + 1)
    em.emit("}", depth)
    em.emit("#else", 0)
    as_written()
    em.emit("#endif", 0)
