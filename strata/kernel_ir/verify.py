"""The Kernel IR verifier: scoping, buffers, barriers in uniform control flow, resource limits,
and the shapes and operands of the warp (mma, ldmatrix, cp.async) and Hopper (wgmma, TMA,
mbarrier) statements. Expressions and buffers are reached through the statements' operand
protocol (ir.py), so a new statement kind is checked for scope and buffers without an edit here;
what it means (what it declares, writes or requires) is written below when it needs checking."""
from __future__ import annotations

from math import prod

from ..core import dtypes
from ..core.expr import Expr, Var, children, free_vars, nodes
from ..core.targets import GPUS, STATIC_SMEM_BYTES
from .cpu_ir import CpuForm
from .ir import (ATOMIC_OPS, HOPPER_STMTS, SWIZZLES, Assign, Atomic, Comment, CpAsync,
                 CpAsyncCommit, CpAsyncWait, FenceProxyAsync, For, If, Kernel, KernelProgram,
                 LdMatrix, Let, Load, LoadVec, MbarArrive, MbarInit, MbarTryWait, MbarWait, Mma,
                 PackHalf2, PrefetchL2, Smem, Store, StoreVec, Sync, ThreadIdx, TmaLoad, While,
                 Wgmma, WgmmaCommit, WgmmaDesc, WgmmaFence, WgmmaWait, walk)
from .prefetch_weights import leading


class KernelVerifyError(Exception):
    pass


# Kernel IR is checked against the most any target allows (a Target says what one allows).
MAX_SMEM_BYTES = STATIC_SMEM_BYTES                                    # static __shared__ per block
MAX_DYNAMIC_SMEM_BYTES = max(t.smem_optin for t in GPUS)             # static + dynamic (opt-in)
WGMMA_TYPES = ("f16", "bf16") + dtypes.FLOAT8


def verify_program(program: KernelProgram, target=None) -> None:
    """Check every kernel; on a CPU target (one thread per block, its "shared memory" a
    scratch array in ordinary memory) the GPU's shared-memory limits do not apply."""
    names = {b.name: b for b in program.buffers}
    for k in program.kernels:
        for p in k.params:
            b = names.get(p.name)
            if b is None or b.dtype != p.dtype or b.numel != p.numel:
                raise KernelVerifyError(f"{k.name}: parameter {p.name} does not match a buffer")
        if k.name not in program.twins:                    # a renamed copy of one checked
            verify_kernel(k, gpu=getattr(target, "kind", "gpu") == "gpu")
    written = {p.name for k in program.kernels for p in k.params if p.output}
    for k in program.kernels:      # what a kernel reads before its grid dependency
        early = {s.buf for s in k.body[:leading(k.body)]}
        if early & written or early - {p.name for p in k.params}:
            raise KernelVerifyError(f"{k.name}: prefetches {sorted(early)} before it waits for "
                                    f"the kernel before it, but the program writes "
                                    f"{sorted(early & written)} (or it is no parameter)")


def _thread_dependent(e: Expr, tainted: set[str]) -> bool:
    if isinstance(e, ThreadIdx):
        return True
    if isinstance(e, Var):
        return e.name in tainted
    return any(_thread_dependent(c, tainted) for c in children(e))


# how an error names the statement whose expression uses an undefined variable
_WHERE = {Let: lambda s: f"let {s.var}", Assign: lambda s: f"assign {s.var}",
          Store: lambda s: f"store to {s.buf}", StoreVec: lambda s: f"store to {s.buf}",
          LoadVec: lambda s: f"vector load from {s.buf}", For: lambda s: f"loop {s.var}",
          If: lambda s: "if", While: lambda s: "while",
          Atomic: lambda s: f"atomic {s.op} on {s.buf}", LdMatrix: lambda s: f"ldmatrix from {s.buf}",
          PackHalf2: lambda s: f"pack {s.var}",
          CpAsync: lambda s: f"cp.async {s.src} -> {s.dst}"}
_WRITES = (Store, StoreVec, Atomic)          # statements that write global memory through `buf`


def verify_kernel(k: Kernel, gpu: bool = True) -> None:
    """Check scoping, buffer references, barriers in uniform control flow and resource limits
    (shared-memory sizes only for a GPU)."""
    if not 1 <= k.block <= 1024 or k.grid < 1 or k.grid >= 2 ** 31:
        raise KernelVerifyError(f"{k.name}: launch grid={k.grid} block={k.block} out of range")
    if gpu and k.static_smem_bytes > MAX_SMEM_BYTES:
        raise KernelVerifyError(f"{k.name}: {k.static_smem_bytes} bytes of shared memory > "
                                f"{MAX_SMEM_BYTES}")
    if gpu and k.static_smem_bytes + k.dynamic_smem_bytes > MAX_DYNAMIC_SMEM_BYTES:
        raise KernelVerifyError(f"{k.name}: {k.static_smem_bytes} + {k.dynamic_smem_bytes} bytes "
                                f"of static + dynamic shared memory > {MAX_DYNAMIC_SMEM_BYTES}")
    _Walk(k).check(k.body, {name for name, _ in k.scalars}, set(), False)
    _check_warp_ops(k)
    _check_hopper_ops(k)


class _Walk:
    """Scope, buffers and barriers through a kernel's bodies: each statement's operands, then its
    own rule from RULES (by class); `tainted` holds the variables whose value differs per thread,
    `divergent` whether the statements run under thread-dependent control flow."""

    def __init__(self, k: Kernel):
        self.k, self.globals = k, {p.name: p for p in k.params}
        self.known = self.globals.keys() | {s.name for s in walk(k.body) if isinstance(s, Smem)}

    def fail(self, what: str):
        raise KernelVerifyError(f"{self.k.name}: {what}")

    def check(self, body, scope: set[str], tainted: set[str], divergent: bool) -> None:
        scope = set(scope)
        for s in body:
            self.operands(s, scope)
            rule = next((RULES[c] for c in type(s).__mro__ if c in RULES), None)
            if rule is not None:
                rule(self, s, scope, tainted, divergent)

    def operands(self, s, scope: set[str]) -> None:
        where, known = _WHERE.get(type(s), lambda s: type(s).__name__)(s), self.known
        for e in s.exprs():
            if missing := free_vars(e) - scope:
                self.fail(f"{where} uses undefined {sorted(missing)}")
            for sub in _all_loads(e):
                if sub.buf not in known:
                    self.fail(f"load from unknown buffer {sub.buf}")
        for b in s.buffers():
            if b not in known:
                self.fail(f"{where}: unknown buffer {b}")
        if isinstance(s, _WRITES) and s.buf in self.globals and not self.globals[s.buf].output:
            self.fail(f"{where}: read-only parameter {s.buf}")

    def define(self, s, scope, tainted, divergent) -> None:          # Let, Assign
        if isinstance(s, Assign) and s.var not in scope:
            self.fail(f"assignment to undeclared {s.var}")
        scope.add(s.var)
        if _thread_dependent(s.value, tainted) or divergent:
            tainted.add(s.var)

    def load_vars(self, s, scope, tainted, divergent) -> None:       # LoadVec, LdMatrix, PackHalf2
        if isinstance(s, LoadVec) and len(s.vars) * dtypes.ITEMSIZE[self.dtype(s.buf)] > 16:
            self.fail("vector load wider than 16 bytes")
        if isinstance(s, PackHalf2) and s.dtype not in ("f16", "bf16"):
            self.fail(f"a 16-bit pair of {s.dtype}")
        names = (s.var,) if isinstance(s, PackHalf2) else s.vars
        scope |= set(names)
        tainted |= set(names)

    def loop(self, s: For, scope, tainted, divergent) -> None:
        if isinstance(s, CpuForm):          # its rule, and sums declared before it
            if problem := s.check() or (f"{s.instruction} adds to undeclared "
                                        f"{sorted(set(s.accumulators()) - scope)}"
                                        if set(s.accumulators()) - scope else None):
                self.fail(problem)
        varying = _thread_dependent(s.start, tainted) or _thread_dependent(s.stop, tainted)
        inner = tainted | ({s.var} if varying else set())
        self.check(s.body, scope | {s.var}, inner, divergent or varying)
        tainted |= inner - {s.var}

    def branch(self, s: If, scope, tainted, divergent) -> None:
        div = divergent or _thread_dependent(s.cond, tainted)
        self.check(s.then, scope, tainted, div)
        self.check(s.orelse, scope, tainted, div)

    def repeat(self, s: While, scope, tainted, divergent) -> None:
        inner = set(tainted)
        self.check(s.body, scope, inner, divergent)   # twice: a variable the body makes
        self.check(s.body, scope, inner, divergent or _thread_dependent(s.cond, inner))
        tainted |= inner                              # thread-dependent taints the condition

    def atomic(self, s: Atomic, scope, tainted, divergent) -> None:
        if s.op not in ATOMIC_OPS:
            self.fail(f"atomic {s.op} (not {'/'.join(ATOMIC_OPS)})")
        if self.dtype(s.buf) not in ("f32", "i32", "i64"):
            self.fail(f"atomics take f32, i32 or i64 buffers, not {self.dtype(s.buf)} ({s.buf})")

    def sync(self, s: Sync, scope, tainted, divergent) -> None:
        if divergent:
            self.fail("__syncthreads() under thread-dependent control flow")

    def accumulate(self, s, scope, tainted, divergent) -> None:      # Mma, Wgmma
        missing = set(s.a + s.b + s.c + s.d if isinstance(s, Mma) else s.d + s.a_regs) - scope
        if missing:                                   # accumulators declared before, read
            self.fail(f"{type(s).__name__.lower()} uses undefined {sorted(missing)}")
        tainted |= set(s.d)

    def declare_flag(self, s: MbarTryWait, scope, tainted, divergent) -> None:
        scope.add(s.var)
        tainted.add(s.var)

    def dtype(self, buf: str) -> str:
        return _buf_dtype(buf, self.globals, self.k)


# statement class (or a base) -> its rule beyond the operands; None: the operands are all there is
# to check, as for a kind this table does not know (tests/kernel_ir: strata's own all have an entry)
RULES = {Let: _Walk.define, Assign: _Walk.define, LoadVec: _Walk.load_vars,
         LdMatrix: _Walk.load_vars, PackHalf2: _Walk.load_vars, For: _Walk.loop,
         If: _Walk.branch, While: _Walk.repeat,
         Atomic: _Walk.atomic, Sync: _Walk.sync, Mma: _Walk.accumulate, Wgmma: _Walk.accumulate,
         MbarTryWait: _Walk.declare_flag,
         **dict.fromkeys((Store, StoreVec, Smem, Comment, CpAsync, CpAsyncCommit, CpAsyncWait,
                          TmaLoad, MbarInit, MbarArrive, MbarWait, WgmmaFence, WgmmaCommit,
                          WgmmaWait, FenceProxyAsync, PrefetchL2))}


def _check_hopper_ops(k: Kernel) -> None:
    """The shapes and operands wgmma, TMA and mbarrier accept, and that tensor maps and
    mbarrier arrays are touched by nothing else (nothing to check, and no walk over a large
    unrolled CPU kernel's every expression, where it has neither)."""
    if not any(p.tensor_map for p in k.params) and \
            not any(isinstance(s, HOPPER_STMTS) for s in walk(k.body)):
        return
    smem = {s.name: s for s in walk(k.body) if isinstance(s, Smem)}
    params = {p.name: p for p in k.params}
    declared = _declared(k)
    bars = {s.bar for s in walk(k.body) if isinstance(s, HOPPER_STMTS) and hasattr(s, "bar")}
    tmaps = {n for n, p in params.items() if p.tensor_map is not None}

    def fail(what: str):
        raise KernelVerifyError(f"{k.name}: {what}")
    for b in sorted(bars):
        if b not in smem or smem[b].dtype != "i64":
            fail(f"mbarrier {b} must be a shared array of i64")
    for name in sorted(tmaps):
        tm, p = params[name].tensor_map, params[name]
        if not 1 <= len(tm.dims) <= 5 or len(tm.box) != len(tm.dims) or \
                len(tm.strides) != len(tm.dims) - 1:
            fail(f"tensor map {name}: dims, box and strides do not agree in rank")
        if prod(tm.dims) > p.numel or any(b < 1 or b > 256 for b in tm.box):
            fail(f"tensor map {name}: dims exceed the buffer or a box side is not in 1..256")
        if tm.swizzle not in SWIZZLES:
            fail(f"tensor map {name}: unknown swizzle {tm.swizzle!r}")
    for s in walk(k.body):
        touched = set() if isinstance(s, HOPPER_STMTS) else set(s.buffers())
        for e in s.exprs():
            touched |= {x.buf for x in _all_loads(e)}
        bad = touched & (bars | tmaps)
        if bad:
            fail(f"{min(bad)} is an mbarrier or tensor map: only TMA and mbarrier "
                 f"statements may use it")
        for e in s.exprs():
            for dsc in (x for x in nodes(e) if isinstance(x, WgmmaDesc)):
                if dsc.buf not in smem or smem[dsc.buf].dtype not in WGMMA_TYPES:
                    fail(f"wgmma descriptor of {dsc.buf}, which is not a shared array of 16-bit "
                         f"or FP8 elements")
                if dsc.swizzle not in SWIZZLES:
                    fail(f"wgmma descriptor with unknown swizzle {dsc.swizzle!r}")
        if isinstance(s, Wgmma):
            if s.dtype not in WGMMA_TYPES:
                fail(f"wgmma takes f16, bf16 or FP8 inputs, not {s.dtype}")
            if s.dtype in dtypes.FLOAT8 and (s.trans_a or s.trans_b):
                fail("wgmma reads FP8 operands K-major only (no transpose bit)")
            if s.n % 8 or not 8 <= s.n <= 256:
                fail(f"wgmma m64nNk{s.k} needs N a multiple of 8 in 8..256, not {s.n}")
            if len(s.d) != s.n // 2:
                fail(f"wgmma m64n{s.n}k{s.k} takes {s.n // 2} f32 accumulators, not {len(s.d)}")
            if (s.a is None) == (not s.a_regs):
                fail("wgmma takes A by a descriptor or by registers, one of the two")
            if s.a_regs and (len(s.a_regs) != 4 or s.trans_a or s.dtype in dtypes.FLOAT8
                             or any(declared.get(v) != "i32" for v in s.a_regs)):
                fail("wgmma's A in registers is four i32 fragment registers of a 16-bit type, "
                     "never transposed")
            for v in s.d:
                if declared.get(v) != "f32":
                    fail(f"wgmma accumulator {v} is not f32")
            if k.block % 128:
                fail(f"wgmma needs whole warpgroups, not a block of {k.block} threads")
        elif isinstance(s, TmaLoad):
            p = params.get(s.tmap)
            if p is None or p.tensor_map is None:
                fail(f"TMA load from {s.tmap}, which is not a tensor-map parameter")
            if s.dst not in smem or smem[s.dst].dtype != p.dtype:
                fail(f"TMA load {s.tmap} -> {s.dst}: needs a shared array of {p.dtype}")
            if len(s.coords) != len(p.tensor_map.dims):
                fail(f"TMA load from {s.tmap} takes {len(p.tensor_map.dims)} coordinates")
        elif isinstance(s, MbarInit) and s.count < 1:
            fail(f"mbarrier.init with count {s.count}")
        elif isinstance(s, MbarArrive) and s.tx_bytes is not None and not 0 <= s.tx_bytes < 2 ** 20:
            fail(f"mbarrier expect_tx of {s.tx_bytes} bytes")
        elif isinstance(s, WgmmaWait) and not 0 <= s.pending <= 7:
            fail(f"wgmma.wait_group {s.pending}")


def _declared(k: Kernel) -> dict[str, str]:
    """Every variable's type: Let, For, vector loads, and the i32 fragment registers."""
    declared: dict[str, str] = {}
    for s in walk(k.body):
        if isinstance(s, (Let, For)):
            declared[s.var] = s.dtype
        elif isinstance(s, LoadVec):
            declared.update(dict.fromkeys(s.vars, s.dtype))
        elif isinstance(s, LdMatrix):
            declared.update(dict.fromkeys(s.vars, "i32"))
        elif isinstance(s, PackHalf2):
            declared[s.var] = "i32"
    return declared


def _check_warp_ops(k: Kernel) -> None:
    """The shapes and types mma, ldmatrix and cp.async accept."""
    smem = {s.name: s.dtype for s in walk(k.body) if isinstance(s, Smem)}
    params = {p.name: p.dtype for p in k.params}
    declared = _declared(k)

    def fail(what: str):
        raise KernelVerifyError(f"{k.name}: {what}")
    for s in walk(k.body):
        if isinstance(s, LdMatrix):
            if len(s.vars) not in (1, 2, 4):
                fail(f"ldmatrix loads 1, 2 or 4 matrices, not {len(s.vars)}")
            if s.buf not in smem or dtypes.ITEMSIZE[smem[s.buf]] != 2:
                fail(f"ldmatrix reads a shared array of 16-bit elements, not {s.buf}")
        elif isinstance(s, Mma):
            if s.dtype not in ("f16", "bf16"):
                fail(f"mma m16n8k16 takes f16 or bf16 inputs, not {s.dtype}")
            if (len(s.a), len(s.b), len(s.c), len(s.d)) != (4, 2, 4, 4):
                fail("mma m16n8k16 takes 4 A registers, 2 B registers, 4 C and 4 D floats")
            for v in s.a + s.b:
                if declared.get(v) != "i32":
                    fail(f"mma operand {v} is not an i32 fragment register")
            for v in s.c + s.d:
                if declared.get(v) != "f32":
                    fail(f"mma accumulator {v} is not f32")
        elif isinstance(s, CpAsync):
            if s.dst not in smem or s.src not in params:
                fail(f"cp.async copies a global parameter to a shared array, not {s.src} -> {s.dst}")
            if smem[s.dst] != params[s.src]:
                fail(f"cp.async {s.src} -> {s.dst} changes the dtype")
            if s.nbytes not in (4, 8, 16) or s.nbytes % dtypes.ITEMSIZE[smem[s.dst]]:
                fail(f"cp.async copies 4, 8 or 16 bytes of whole elements, not {s.nbytes}")
            if s.cache not in ("ca", "cg") or (s.cache == "cg" and s.nbytes != 16):
                fail(f"cp.async.{s.cache} of {s.nbytes} bytes (cg copies 16 bytes only)")
        elif isinstance(s, CpAsyncWait) and s.pending < 0:
            fail(f"cp.async.wait_group {s.pending}")


def _buf_dtype(name, globals_, k: Kernel) -> str:
    if name in globals_:
        return globals_[name].dtype
    for s in walk(k.body):
        if isinstance(s, Smem) and s.name == name:
            return s.dtype
    raise KernelVerifyError(f"{k.name}: unknown buffer {name}")


def _all_loads(e: Expr):
    return (x for x in nodes(e) if isinstance(x, Load))
