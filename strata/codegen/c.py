"""Kernel IR -> C11 for the CPU (gcc/clang with OpenMP): the first native CPU target.

Why C: the kernels of a CPU schedule use one thread per block (block == 1), so a kernel is a loop
over its blocks, which are independent: `#pragma omp parallel for schedule(static)` runs them on
every core (unless the whole kernel is less work than waking the threads costs), threadIdx.x is
0 and blockIdx.x is the loop variable. The walk is the C family's (codegen/cfamily.py:
expressions, the scalar templates of scalar_ops.py with `{f}`, literals, casts, index types,
provenance comments); CEmitter adds what is C's:
  - a kernel is `static void k_name(const T* restrict in, ..., T* restrict out)`, and
    `void strata_run(void** args)` calls every kernel in launch order with args[k] the data
    pointer of KernelProgram.buffers[k] (one ctypes call per program run);
  - bf16 and f16 are uint16_t in memory (FP8 uint8_t), converted in registers by the prelude
    (c_prelude.py);
  - vector loads/stores (load.v4 ...) are plain element accesses: the compiler vectorises;
  - `#pragma omp simd [reduction(...)]` on the innermost loops kernel_ir/simd_plan.py proves safe,
    `#pragma GCC unroll n` for loops the schedule marks unrolled with a constant trip count;
  - a block's "shared memory" (Smem, a packed GEMM panel) is a scratch array each OpenMP thread
    allocates once (64-byte aligned) and reuses for all its blocks; a barrier is a no-op.
Kernels a CPU cannot run (block != 1, shuffles, tensor cores, async copies, TMA, mbarriers,
tensor maps) are refused with a CompileError naming kernel and node.
"""
from __future__ import annotations

from ..core import dtypes
from ..core.errors import CompileError
from ..core.expr import Expr, Op, Var, nodes
from ..core.scalar_ops import TRANSCENDENTAL
from ..kernel_ir.ir import (Assign, Atomic, BlockIdx, For, If, Kernel, KernelProgram, Let, Load,
                            LoadVec, Smem, Store, ThreadIdx, walk)
from ..kernel_ir.cpu_ir import (AmxTiles, CpuForm, DotBf16, LaneSum, OuterFma, PairsBf16, QuantRow,
                                QuantRows)
from ..kernel_ir.lower_cpu import lower_cpu_forms
from ..kernel_ir.simd_plan import plan_loop
from ..kernel_ir.thread_loops import to_thread_loops
from .c_amx import AMX_PRELUDE, emit_amx
from .c_dot import emit_dot
from .c_int8_rows import INT8_ROWS_PRELUDE, emit_quant_rows
from .c_outer import emit_outer
from .c_pairs import emit_pairs
from .c_prelude import PRELUDE
from .c_qdot import QDOT_PRELUDE, emit_quant_blocks
from .cfamily import (ATOM, INDENT, REL, CFamilyEmitter, cname, distinct_kernels, refuse_unprintable,
                      numbered, strip_parens)

# Storage type of each dtype in C (CUDA's, with the 16-bit floats as their bits).
C_TYPES = {**dtypes.C_STORAGE, "f16": "uint16_t", "bf16": "uint16_t", "f8e4m3": "uint8_t",
           "f8e5m2": "uint8_t"}
TO_FLOAT = {d: f"st_{d}_to_float" for d in dtypes.NARROW}       # the prelude's
TO_STORAGE = {d: f"st_float_to_{d}" for d in dtypes.NARROW}
UNROLL_MAX = 64      # `#pragma GCC unroll n` up to this trip count
SERIAL_WORK = 1 << 17    # statements run by a whole kernel below which it stays on one thread:
                         # waking the OpenMP team costs 1.5 to 2 us; `strata tune` found kernels
                         # of 20k to 68k statements 1.4x to 3.9x faster on one thread, one of 625k
                         # not (the 2-core EPYC, 2026-11-25)
CALL_WORK = 16           # ... a tanh, exp, erf counted as this many more (libmvec's tanhf takes 2.8
                         # cycles an element on Zen 3, a vectorised statement a fraction of one)


REFUSED = ("the C target cannot run: it runs one thread per block (block=1), with no warp "
           "shuffles, tensor cores or asynchronous copies")


def check_kernel(k: Kernel) -> None:
    """Raise CompileError unless the C target can run `k` (see the module docstring)."""
    if k.block != 1:
        raise CompileError(f"kernel {k.name} has block={k.block}: the C target runs one thread "
                           f"per block (block=1); schedule it for the CPU")
    for p in k.params:
        if p.tensor_map is not None:
            raise CompileError(f"kernel {k.name} uses a TMA tensor map (parameter {p.name}), which "
                               f"{REFUSED}")
    for s in walk(k.body):
        if isinstance(s, CpuForm) and type(s) not in FORMS:
            raise CompileError(f"kernel {k.name}: the C target has no printer for "
                               f"{type(s).__name__} ({s.instruction}); add one to codegen/c.py's FORMS")
    refuse_unprintable(k, "c", REFUSED)


class CEmitter(CFamilyEmitter):
    """The family's walk with C's kernel frame, 16-bit storage, loops, pragmas and vector code."""
    to_float = TO_FLOAT
    to_storage = TO_STORAGE

    def __init__(self, kernel: Kernel):
        super().__init__(kernel)
        self.types: dict[str, str] = {}
        self.flags: dict[str, str] = {}     # accumulator -> its NaN flag, in a loop being emitted
        self.lanes: dict[str, str] = {}     # accumulator -> its lane (`acc_l[i_l]`), likewise
        self.raw: dict[str, str] = {}       # a 16-bit load's variable -> its dtype (st_raw_<v>)
        loaded = {s.var for s in walk(kernel.body) if isinstance(s, Let) and isinstance(s.value, Load)}
        self.copied = {s.value.name for s in walk(kernel.body)      # stored as they are (maybe)
                       if isinstance(s, Store) and isinstance(s.value, Var)} & loaded
        for s in walk(kernel.body):
            if isinstance(s, (Let, For)):
                self.types[s.var] = s.dtype
            elif isinstance(s, LoadVec):
                self.types.update(dict.fromkeys(s.vars, s.dtype))
        self.amx = any(isinstance(s, AmxTiles) for s in walk(kernel.body))     # c_amx.py
        grouped = {id(r) for s in walk(kernel.body) if isinstance(s, QuantRows)
                   for r in walk(s.body) if isinstance(r, QuantRow)}
        self.xr = {s.row.x: s for s in walk(kernel.body) if isinstance(s, QuantRows)}   # c_int8_rows.py
        self.xq = sorted({s.x for s in walk(kernel.body) if isinstance(s, QuantRow) and s.vnni
                          and id(s) not in grouped})

    # ------------------------------------------------------------ expressions

    def ids(self, e):
        return ("0" if isinstance(e, ThreadIdx) else "blockIdx"), ATOM

    def op(self, e: Op) -> tuple[str, int]:
        a = e.args
        if e.op in ("add", "subtract") and isinstance(a[-1], ThreadIdx):
            return self.ex(a[0])                    # threadIdx.x is 0
        if e.op == "add" and isinstance(a[0], ThreadIdx):
            return self.ex(a[1])
        if e.op in ("exp", "exp_shifted") and e.dtype == "f32":    # st_expf[_shifted], c_tail.h
            return f"st_expf{e.op.removeprefix('exp')}({strip_parens(self.expr(a[0]))})", ATOM
        return super().op(e)

    def stored(self, buf: str, value: Expr) -> str:
        if isinstance(value, Var) and self.raw.get(value.name) == self.bufs.get(buf):
            return f"st_raw_{cname(value.name)}"    # a 16-bit value stored as it was loaded
        return super().stored(buf, value)

    # ------------------------------------------------------------ statements

    def barrier(self, depth: int) -> None:
        pass                                        # the block is one thread

    def atomic(self, s: Atomic, depth: int) -> None:
        t = {"f32": "float", "i32": "int32", "i64": "int64"}[self.bufs[s.buf]]
        self.emit(f"st_atomic_{s.op}_{t}(&{cname(s.buf)}[{strip_parens(self.expr(s.index))}], "
                  f"{strip_parens(self.expr(s.value))});", depth)

    PRINTERS = {**CFamilyEmitter.PRINTERS, CpuForm: "form"}

    def let(self, s: Let, depth: int) -> None:
        self.raw.pop(s.var, None)
        if isinstance(s.value, Load) and s.var in self.copied and self.bufs.get(s.value.buf) in TO_FLOAT:
            self.raw[s.var] = self.bufs[s.value.buf]    # its bits too: a copy is a move, not a
            self.emit(f"uint16_t st_raw_{cname(s.var)} = "  # widening and a rounding (c.py)
                      f"{cname(s.value.buf)}[{strip_parens(self.expr(s.value.index))}];", depth)
            return self.emit(f"float {cname(s.var)} = {TO_FLOAT[self.raw[s.var]]}"
                             f"(st_raw_{cname(s.var)});", depth)
        super().let(s, depth)

    def assign(self, s: Assign, depth: int) -> None:
        self.raw.pop(s.var, None)
        if s.var in self.flags:                         # a NaN-flagged max/min (simd_plan.py)
            acc, (a, b) = cname(s.var), s.value.args
            x = strip_parens(self.expr(b if isinstance(a, Var) and a.name == s.var else a))
            cmp = ">" if s.value.op == "maximum" else "<"
            t = self.ctype(s.var, self.types[s.var])
            return self.emit(f"{{ {t} st_x = {x}; {self.flags[s.var]} |= st_x != st_x; "
                             f"{acc} = {acc} {cmp} st_x ? {acc} : st_x; }}", depth)
        if s.var in self.lanes:                         # a laned sum (loop())
            a, b = s.value.args
            x = b if isinstance(a, Var) and a.name == s.var else a
            return self.emit(f"{self.lanes[s.var]} += {strip_parens(self.expr(x))};", depth)
        super().assign(s, depth)

    def form(self, s: CpuForm, depth: int) -> None:
        """A CPU instruction form (kernel_ir/cpu_ir.py): its printer, given its plain loop."""
        FORMS[type(s)](self, s, depth, lambda: self.loop(s, depth))

    def loop(self, s: For, depth: int) -> None:
        plan = plan_loop(s, self.types)
        lanes = getattr(s, "lanes", 0)          # a LaneSum, or a form's fallback (lower_cpu.py)
        if lanes:
            return self.laned_sum(s, plan, lanes, depth)
        flags = {v: cname(f"{v}_nan") for v in plan.nan_flags}   # see simd_plan.py
        for v, flag in flags.items():
            self.emit(f"int {flag} = {cname(v)} != {cname(v)};", depth)
        pragma = plan.pragma(cname)
        if pragma:
            self.emit(pragma, depth)
        trips = s.trip_count
        if s.unroll and not pragma and trips is not None and 1 < trips <= UNROLL_MAX:
            self.emit(f"#pragma GCC unroll {trips}", depth)   # (one pragma per loop: simd wins)
        v, t = cname(s.var), self.ctype(s.var, s.dtype)
        inc = f"{v}++" if s.step == 1 else f"{v} += {s.step}"
        self.emit(f"for ({t} {v} = {strip_parens(self.expr(s.start))}; {v} < "
                  f"{self.expr(s.stop, REL + 1)}; {inc}) {{", depth)
        self.flags, outer = {**self.flags, **flags}, self.flags
        self.body(s.body, depth + 1)
        self.flags = outer
        self.emit("}", depth)
        for v, flag in flags.items():
            self.emit(f"if ({flag}) {cname(v)} = NAN;", depth)

    def laned_sum(self, s: For, plan, lanes: int, depth: int) -> None:
        """`s` (innermost) in chunks of `lanes` iterations, each adding into its own lane of each
        sum (a vector register per 16), the lanes added as a tree after it."""
        v, t = cname(s.var), self.ctype(s.var, s.dtype)
        self.lanes = {a: f"{cname(a)}_l[{v}_l]" for _, a in plan.reductions}
        for acc in self.lanes:
            self.emit(f"float {cname(acc)}_l[{lanes}] = {{0}};", depth)
        self.emit(f"for ({t} {v}_o = {strip_parens(self.expr(s.start))}; {v}_o < "
                  f"{self.expr(s.stop, REL + 1)}; {v}_o += {lanes}) {{", depth)
        self.emit("#pragma omp simd", depth + 1)
        self.emit(f"for ({t} {v}_l = 0; {v}_l < {lanes}; {v}_l++) {{", depth + 1)
        self.emit(f"{t} {v} = {v}_o + {v}_l;", depth + 2)
        self.body(s.body, depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)
        for acc in self.lanes:
            self.emit(f"{cname(acc)} += st_lane_sum{lanes}({cname(acc)}_l);", depth)
        self.lanes = {}

    # ------------------------------------------------------------ the kernel

    def kernel(self) -> str:
        k = self.k
        params = [f"{'' if p.output else 'const '}{C_TYPES[p.dtype]}* restrict {cname(p.name)}"
                  for p in k.params] + [f"{C_TYPES[t]} {cname(n)}" for n, t in k.scalars]
        for line in (k.src or "").splitlines():
            self.lines.append(f"// {line}")
        if self.wide:
            self.lines.append("// indices reach 2^31: index arithmetic in long long")
        parallel = runs_in_parallel(k)
        why = (f"THREADS={k.threads}" if k.threads else
               f"under {SERIAL_WORK} statements: less work than waking threads")
        self.lines.append(f"// grid = {k.grid} block{'s' if k.grid != 1 else ''} of one thread"
                          + (", run in parallel (OpenMP" + (f", {k.threads} threads)" if k.threads
                                                              else ")") if parallel else
                             f", in turn ({why})" if k.grid > 1 else ""))
        team = f" num_threads({k.threads if k.threads > 1 else 'ST_TEAM'})" if parallel else ""
        sig = f"{cname(k.name)}({', '.join(params)}) {{"
        if len("static void ") + len(sig) <= 100:
            self.lines.append(f"static void {sig}")
        else:
            self.lines.append("static void")
            self.wrap_signature(cname(k.name), params)
        scratch = {s.name: s for s in walk(k.body) if isinstance(s, Smem)}
        self.hoisted = set(scratch)
        depth = 2 if parallel and (scratch or self.amx) else 1
        if self.amx:        # tiles or their emulation, asked once per call (c_amx.py)
            self.emit("const int st_amx = st_amx_mode();", 1)
        numel = {p.name: p.numel for p in k.params}
        xq = self.xq            # QuantRows' activations in int8
        if xq:              # QDOT=vnni: the rows' activations as int8 blocks, once per call (c_qdot.py)
            self.emit("#if ST_VNNI", 0)
            for x in xq:
                self.emit(f"st_xq8 st_xq_{cname(x)} = st_quantize_{self.bufs[x]}({cname(x)}, {numel[x]});", 1)
            self.emit("#endif", 0)
        if self.xr:         # QuantRows' activations: int8 blocks, rows as lanes (c_int8_rows.py)
            self.emit("#if ST_VNNI", 0)
            for x, form in self.xr.items():
                self.emit(f"st_xr8 st_xr_{cname(x)} = st_quantize_rows_{self.bufs[x]}({cname(x)}, "
                          f"{form.rows}, {numel[x] // form.rows});", 1)
            self.emit("#endif", 0)
        if depth == 2:
            self.emit(f"#pragma omp parallel{team}", 1)
            self.emit("{", 1)
        for s in scratch.values():
            self.emit(f"{C_TYPES[s.dtype]}* restrict {cname(s.name)} = st_scratch({s.size} * "
                      f"sizeof({C_TYPES[s.dtype]}));", depth)
        if self.amx:
            self.emit("st_amx_start(st_amx);", depth)
        if k.grid == 1:
            if _uses_block_idx(k):
                self.emit(f"const {self.index_t} blockIdx = 0;", 1)
            self.body(k.body, 1)
        elif k.grid > 1:
            if parallel:
                self.emit(f"#pragma omp {'for' if depth == 2 else 'parallel for' + team} "
                          f"schedule(static)", depth)
            self.emit(f"for ({self.index_t} blockIdx = 0; blockIdx < {k.grid}; blockIdx++) {{", depth)
            self.body(k.body, depth + 1)
            self.emit("}", depth)
        if self.amx:
            self.emit("st_amx_end(st_amx);", depth)
        for s in scratch.values():
            self.emit(f"free({cname(s.name)});", depth)
        if depth == 2:
            self.emit("}", 1)
        if xq:
            self.emit("#if ST_VNNI", 0)
            for x in xq:
                self.emit(f"st_xq8_free(st_xq_{cname(x)});", 1)
            self.emit("#endif", 0)
        if self.xr:
            self.emit("#if ST_VNNI", 0)
            for x in self.xr:
                self.emit(f"st_xr8_free(st_xr_{cname(x)});", 1)
            self.emit("#endif", 0)
        self.lines.append("}")
        return "\n".join(self.lines)


# The printer of each CPU instruction form (kernel_ir/cpu_ir.py): (emitter, form, depth, the
# loop as written) -> None.
FORMS = {DotBf16: emit_dot, PairsBf16: emit_pairs, OuterFma: emit_outer, QuantRow: emit_quant_blocks,
         QuantRows: emit_quant_rows,
         AmxTiles: lambda em, s, depth, _: emit_amx(em, s, depth),
         LaneSum: lambda em, s, depth, as_written: as_written()}     # CEmitter.laned_sum


def runs_in_parallel(k: Kernel) -> bool:
    """Whether the kernel's blocks run on an OpenMP team: THREADS > 1, or THREADS unset and
    enough work to pay for waking the team."""
    return k.grid > 1 and (k.threads > 1 or
                           not k.threads and k.grid * _work(k.body) >= SERIAL_WORK)


def _work(body) -> int:
    """Statements one block runs (a loop of unknown trip count counted as 16 iterations)."""
    n = 0
    for s in body:
        if isinstance(s, For):
            n += (s.trip_count or 16) * max(1, _work(s.body))
        elif isinstance(s, If):
            n += 1 + max(_work(s.then), _work(s.orelse))
        else:
            n += 1 + CALL_WORK * sum(isinstance(x, Op) and x.op in TRANSCENDENTAL
                                     for e in s.exprs() for x in nodes(e))
    return n


def _uses_block_idx(k: Kernel) -> bool:
    return any(isinstance(x, BlockIdx) for s in walk(k.body) for e in s.exprs() for x in nodes(e))


# ---------------------------------------------------------------- public entry points

def emit_kernel(kernel: Kernel) -> str:
    """C for one kernel (needs the prelude of `emit_program` to compile)."""
    check_kernel(kernel)
    return CEmitter(kernel).kernel()


def emit_program(program: KernelProgram, target=None) -> str:
    """One translation unit: the prelude, every kernel once, then `strata_run(void** args)`.
    target: the CPU target (a strata.core.targets.Target or its name), printed in the header; the
    code itself is the same for every CPU (the compiler's -march picks the instructions)."""
    if getattr(target, "is_gpu", False):
        raise CompileError(f"C is the CPU target's language; {target} is a GPU (emit CUDA)")
    names = ", ".join(k.name for k in program.kernels)
    where = f"{target} " if target is not None else ""
    parts = [f"// strata: {len(program.kernels)} kernel(s) for the CPU {where}(C11, OpenMP): "
             f"{names}", PRELUDE.rstrip()]
    same: dict[str, str] = {}        # a kernel's text with its names numbered -> the C function
    calls: dict[str, str] = {}       # kernel -> the function that computes it
    twins = getattr(program, "twins", {})
    for k in distinct_kernels(program):
        if twins.get(k.name) in calls:      # a renamed copy (kernel_ir/twins.py): the same code
            calls[k.name] = calls[twins[k.name]]
            continue
        text = emit_kernel(k)
        calls[k.name] = same.setdefault(numbered(text, k), cname(k.name))
        if calls[k.name] == cname(k.name):
            parts.append(text)
    if any("st_amx_mode()" in p for p in parts):
        parts[1] += AMX_PRELUDE.rstrip()
    if any("(codegen/c_qdot.py)" in p or "(codegen/c_int8_rows.py)" in p for p in parts[2:]):
        parts[1] += QDOT_PRELUDE.rstrip()
    if any("(codegen/c_int8_rows.py)" in p for p in parts[2:]):
        parts[1] += "\n" + INT8_ROWS_PRELUDE.rstrip()
    parts.append(_entry_point(program, calls))
    return "\n\n".join(parts) + "\n"


def emit_source(kernels: list[Kernel]) -> str:
    """Hand-written kernels (@strata.kernel, any block size: their threads become loops) with an
    entry `strata_launch(void** args)` per kernel (suffixed by its name when there are several):
    args holds the parameters' data pointers, then pointers to the scalar arguments."""
    ones = [lower_cpu_forms(to_thread_loops(k)) for k in kernels]
    parts = [f"// strata: @strata.kernel {', '.join(k.name for k in kernels)} for the CPU (C11, "
             f"OpenMP)", PRELUDE.rstrip()]
    for one in ones:
        args = [f"({'' if p.output else 'const '}{C_TYPES[p.dtype]}*)args[{i}]"
                for i, p in enumerate(one.params)]
        args += [f"*(const {C_TYPES[t]}*)args[{len(one.params) + j}]"
                 for j, (_, t) in enumerate(one.scalars)]
        entry = "strata_launch" + (f"_{cname(one.name)}" if len(ones) > 1 else "")
        parts += [emit_kernel(one),
                  f"void {entry}(void** args) {{\n    {cname(one.name)}({', '.join(args)});\n}}"]
    return "\n\n".join(parts) + "\n"


def _entry_point(program: KernelProgram, calls: dict | None = None) -> str:
    index = {b.name: i for i, b in enumerate(program.buffers)}
    lines = ["// Every kernel in launch order; args[k] is the data of KernelProgram.buffers[k]:",
             *(f"//   args[{i}] {b.name}: {b.dtype}{list(b.shape)} {b.kind}"
               for i, b in enumerate(program.buffers)),
             "void strata_run(void** args) {"]
    calls_made = []
    for k in program.kernels:
        args = []
        for p in k.params:
            if p.name not in index:
                raise CompileError(f"kernel {k.name}: parameter {p.name} is no buffer of the program")
            args.append(f"({'' if p.output else 'const '}{C_TYPES[p.dtype]}*)args[{index[p.name]}]")
        fn = (calls or {}).get(k.name, cname(k.name))
        calls_made.append(f"{fn}({', '.join(args)});")
        call = calls_made[-1]
        if len(INDENT + call) > 100:
            call = f"{fn}(" + f",\n{INDENT}{' ' * (len(fn) + 1)}".join(args) + ");"
        if fn != cname(k.name):
            lines.append(f"{INDENT}// {k.name}: the same code as {fn}")
        lines.append(INDENT + call)
    if not program.kernels:
        lines.append(f"{INDENT}(void)args;      // nothing to compute (empty tensors)")
    # one kernel alone, by launch index, on buffers a whole run filled: what the tuner times
    lines += ["}", "", "void strata_run_kernel(int k, void** args) {", f"{INDENT}switch (k) {{",
              *(f"{INDENT}case {i}: {c} break;" for i, c in enumerate(calls_made)),
              f"{INDENT}default: (void)args;", f"{INDENT}}}", "}"]
    once = getattr(program, "once", ())
    if once:          # the runtime ran these when it loaded the program (their inputs are weights)
        lines += ["", f"// Every kernel but {', '.join(once)}, run once when the program was loaded",
                  "void strata_run_per_call(void** args) {",
                  *(f"{INDENT}strata_run_kernel({i}, args);" for i, k in enumerate(program.kernels)
                    if k.name not in once), "}"]
    return "\n".join(lines)
