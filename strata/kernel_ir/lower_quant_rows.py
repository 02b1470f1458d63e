"""Kernel IR for a CPU: a QGEMM=int8 kernel's group of weight rows becomes one QuantRows form.

Why: tile/passes/cpu_int8_rows.py writes a prefill's quantized product as loops a decode step
already runs (for each of a group's weight rows, for each activation row, a QuantRow and the
store of its sum), so the simulator and the verifier need nothing new; here the group's loop is
stated as the one form the C printer runs as codegen/c_int8_rows.py's kernel. Declines (the
loops stay QuantRows, correct and slower) unless exactly that: one QuantRow of int8 activations
(rows of K from the buffer's start, f16 or bf16 scales) and one store of its sum, the rows side
by side.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..core.expr import Const, coefficient, evaluate, free_vars
from .cpu_ir import BLOCK_LANES, LANES, QuantRow, QuantRows
from .ir import For, Kernel, Store, walk

GROUP = 8                       # weight rows a form (tile/passes/cpu_int8_rows.py's INT8_ROWS)
HALF = ("f16", "bf16")         # the scales the kernel reads


def lower_quant_rows(k: Kernel) -> Kernel:
    if dict(k.knobs).get("QGEMM") != "int8":
        return k
    bufs = {p.name: p.dtype for p in k.params}
    return replace(k, body=tuple(_form(s, bufs) or s for s in k.body))


def _form(loop, bufs: dict) -> QuantRows | None:
    if not isinstance(loop, For) or loop.trip_count != GROUP or len(loop.body) != 1 \
            or not isinstance(inner := loop.body[0], For) or not isinstance(inner.stop, Const):
        return None
    rows = [s for s in walk(inner.body) if isinstance(s, QuantRow)]
    stores = [s for s in inner.body if isinstance(s, Store)]
    if len(rows) != 1 or not rows[0].vnni or rows[0].x is None or len(stores) != 1:
        return None
    row, store, m = rows[0], stores[0], inner.var
    k = (row.trip_count or 0) * BLOCK_LANES.get(row.fmt, LANES)
    if not (isinstance(row.start, Const) and row.start.value == 0) \
            or not free_vars(row.x_at) <= {m, row.var} or coefficient(row.x_at, m) != k \
            or int(evaluate(row.x_at, {m: np.int64(0), row.var: np.int64(0)})) \
            or coefficient(store.index, loop.var) != 1 or bufs.get(row.vnni[0].buf) not in HALF:
        return None
    return QuantRows.of(loop, row=row, m=m, rows=int(inner.stop.value), out=store.buf,
                        out_at=store.index)

