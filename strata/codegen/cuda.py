"""Kernel IR -> CUDA C: one walk over the tree, printing code a person would write by hand.

`emit_program` gives one translation unit (fp16/bf16 headers, the `st_*` helpers that the C
templates of scalar_ops.py call, then every kernel); `emit_kernel` prints one kernel.

Types: values are in their compute type (float for f32/f16/bf16, double, bool, integers).
Integer variables that only hold index arithmetic (built from threadIdx/blockIdx, loop variables
and constants) are `int`; a kernel where some buffer, or grid * block, reaches 2^31 elements uses
`long long` for them instead and widens blockIdx.x before it is multiplied. Integer variables
holding data (loaded from a buffer, shuffled, converted from floats) keep their declared type.
Global f16/bf16 data is converted at the access (`__half2float`, `__float2bfloat16_rn`), vector
accesses are one aligned 4/8/16-byte load or store (float4, or uint4 unpacked as __half2 pairs).
Tensor-core and async-copy statements (Mma, LdMatrix, CpAsync*) are inline PTX, one asm
statement each; fragment registers are `int`. A program using them gets TENSOR_CORE_PRELUDE,
which refuses (#error) to compile for an architecture below sm_80. Hopper statements (TmaLoad,
Mbar*, Wgmma*, FenceProxyAsync) are inline PTX too, with HOPPER_PRELUDE (the CUtensorMap
parameter type, descriptor construction, the mbarrier wait loop; sm_90+) and, for wgmma, a
guard that needs sm_90a; shared arrays they touch are 1024-byte aligned for the swizzles.
"""
from __future__ import annotations

from ..core import dtypes
from ..core.errors import CompileError
from ..core.expr import Expr, nodes
from ..kernel_ir.ir import (DYNAMIC_SMEM_ALIGN, HOPPER_STMTS, SWIZZLES, Atomic, BlockIdx, CpAsync,
                            CpAsyncCommit, CpAsyncWait, FenceProxyAsync, Kernel, KernelProgram,
                            LdMatrix, Load, LoadVec, MbarArrive, MbarInit, MbarTryWait, MbarWait,
                            Mma, PackHalf2, PrefetchL2, ShflIdx, ShflXor, Smem, StoreVec,
                            ThreadIdx, TmaLoad, Wgmma, WgmmaCommit, WgmmaDesc, WgmmaFence,
                            WgmmaWait, walk)
from ..kernel_ir.prefetch_weights import leading
from ..core.targets import Target, get_target
from .cfamily import (ATOM, INDENT, LINE, UNARY, CFamilyEmitter, cname, distinct_kernels,
                      fp8_convert, prelude, refuse_unprintable, strip_parens, torch_math)

PRELUDE = r"""// NVRTC has no <math.h>: the float specials as bit patterns (device code only).
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

// Programmatic dependent launch (sm_90+): every kernel first waits until the kernel before it
// has finished and its writes are visible, then lets the next one be scheduled; the runtime
// joins a program's kernels by programmatic edges, so a launch overlaps its predecessor's tail.
// Launched without that attribute (or before sm_90) both are no-ops.
__device__ __forceinline__ void st_grid_dependency() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Ask L2 for `bytes` (a multiple of 16) of global memory from p, 16-byte aligned (sm_90+; before,
// a no-op): what a kernel reads before st_grid_dependency(), its weights (PrefetchL2).
__device__ __forceinline__ void st_prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes) : "memory");
#endif
}

// torch semantics: NaN propagates through maximum/minimum and sign; mod takes the divisor's sign;
// a tie (-0.0, 0.0) gives b, as NumPy (the simulator) does.
""" + torch_math("__device__ __forceinline__") + "\n" + fp8_convert(
    "__device__ __forceinline__", "unsigned char", "unsigned int", "__float_as_uint", "__uint_as_float",
    lambda ptx: ("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890   // cvt to f16x2: exact",
                 f'    unsigned int h; asm("cvt.rn.f16x2.{ptx}x2 %0, %1;" : "=r"(h) : "h"((unsigned short)b));',
                 "    return __half2float(__ushort_as_half((unsigned short)h));")) + "\n"
# atomicMax/Min on floats: a compare-and-swap loop on the bits (NaN never replaces a value).
ATOMIC_PRELUDE = r"""__device__ __forceinline__ void st_atomic_max(float* p, float v) {
    int* q = (int*)p; int old = *q, seen;
    do { seen = old; if (!(v > __int_as_float(seen))) return;
         old = atomicCAS(q, seen, __float_as_int(v)); } while (old != seen);
}
__device__ __forceinline__ void st_atomic_min(float* p, float v) {
    int* q = (int*)p; int old = *q, seen;
    do { seen = old; if (!(v < __int_as_float(seen))) return;
         old = atomicCAS(q, seen, __float_as_int(v)); } while (old != seen);
}"""

TENSOR_CORE_PRELUDE = prelude("cuda_tensor_core.h")
WARP_OPS = (Mma, LdMatrix, CpAsync, CpAsyncCommit, CpAsyncWait, PackHalf2)

HOPPER_PRELUDE = prelude("cuda_hopper.h")
PACK_PRELUDE = prelude("cuda_pack.h")
WGMMA_GUARD = r"""#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "strata: these kernels use wgmma, which needs sm_90a (--gpu-architecture=sm_90a)"
#endif"""

_CARRIER = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
_F32_VEC = {2: "float2", 4: "float4"}
_MAKE_VEC = {("f32", 2): "make_float2", ("f32", 4): "make_float4", ("i32", 2): "make_int2",
             ("i32", 4): "make_int4", ("i64", 2): "make_longlong2"}
_INT_VEC = {("i32", 2): "int2", ("i32", 4): "int4", ("i64", 2): "longlong2"}
_HALF2 = {"f16": "__half2", "bf16": "__nv_bfloat162"}
_TO_STORAGE = {"f16": "__float2half_rn", "bf16": "__float2bfloat16_rn"}
_TO_FLOAT = {"f16": "__half2float", "bf16": "__bfloat162float"}
_PACK2 = {"f16": "__floats2half2_rn", "bf16": "__floats2bfloat162_rn"}
_PTX_TYPE = {"f8e4m3": "e4m3", "f8e5m2": "e5m2"}        # wgmma's operand types


# ---------------------------------------------------------------- the emitter

class CudaEmitter(CFamilyEmitter):
    """The family's walk with CUDA's frame, C++ operators, vector types, atomics and inline PTX."""
    cxx = True
    to_float = {"f16": "__half2float", "bf16": "__bfloat162float",     # FP8: the prelude's
                **{d: f"st_{d}_to_float" for d in dtypes.FLOAT8}}
    to_storage = {"f16": "__float2half_rn", "bf16": "__float2bfloat16_rn",
                  **{d: f"st_float_to_{d}" for d in dtypes.FLOAT8}}

    def __init__(self, kernel: Kernel):
        super().__init__(kernel)
        self.vector_bufs = {s.buf for s in walk(kernel.body)      # accessed 16 bytes at a time
                            if isinstance(s, (LoadVec, StoreVec, LdMatrix))}
        self.vector_bufs |= {s.dst for s in walk(kernel.body) if isinstance(s, CpAsync)}
        self.swizzled = _async_proxy_bufs(kernel)     # TMA / wgmma operands: 1024-byte aligned

    # ------------------------------------------------------------ expressions

    def ids(self, e):
        name = "threadIdx.x" if isinstance(e, ThreadIdx) else "blockIdx.x"
        if self.wide and isinstance(e, BlockIdx):
            return f"(long long){name}", UNARY
        if self.signed:
            return f"(int){name}", UNARY
        return name, ATOM

    def ex(self, e: Expr) -> tuple[str, int]:
        if isinstance(e, ShflXor):
            return self.shfl("__shfl_xor_sync", e.value, str(e.mask), e.dtype), ATOM
        if isinstance(e, ShflIdx):
            return self.shfl("__shfl_sync", e.value, self.expr(e.lane), e.dtype), ATOM
        if isinstance(e, WgmmaDesc):
            return (f"st_wgmma_desc(&{cname(e.buf)}[{strip_parens(self.expr(e.index))}], {e.lbo}, "
                    f"{e.sbo}, {SWIZZLES[e.swizzle]})"), ATOM
        return super().ex(e)

    def rounded_arg(self, e: Expr) -> str:
        return self.expr(e)

    def shfl(self, fn: str, value: Expr, arg: str, dtype: str) -> str:
        if dtype == "bool":
            return f"(bool){fn}(0xffffffffu, (int){self.expr(value, UNARY)}, {arg})"
        return f"{fn}(0xffffffffu, {self.expr(value)}, {arg})"

    # ------------------------------------------------------------ statements

    def barrier(self, depth: int) -> None:
        self.emit("__syncthreads();", depth)

    def shared_array(self, s: Smem, depth: int) -> None:
        ct = dtypes.C_STORAGE[s.dtype]
        if s.dynamic:                   # a slice of the aligned dynamic arrays
            self.emit(f"{ct}* {cname(s.name)} = reinterpret_cast<{ct}*>(st_dyn_smem + "
                      f"{self.dyn_offsets[s.name]});", depth)
            return
        align = "__align__(16) " if s.name in self.vector_bufs else ""
        align = "__align__(1024) " if s.name in self.swizzled else align
        self.emit(f"__shared__ {align}{ct} {cname(s.name)}[{s.size}];", depth)

    PRINTERS = {**CFamilyEmitter.PRINTERS, LdMatrix: "ldmatrix", Mma: "mma", CpAsync: "cp_async",
                PackHalf2: "pack_half2",
                CpAsyncCommit: "cp_async_commit", CpAsyncWait: "cp_async_wait", Wgmma: "wgmma",
                WgmmaFence: "wgmma_fence", WgmmaCommit: "wgmma_commit", WgmmaWait: "wgmma_wait",
                FenceProxyAsync: "fence_proxy_async", MbarInit: "mbar_init",
                MbarArrive: "mbar_arrive", MbarTryWait: "mbar_try_wait", MbarWait: "mbar_wait",
                TmaLoad: "tma_load", PrefetchL2: "prefetch_l2"}

    def ldmatrix(self, s: LdMatrix, depth: int) -> None:
        names = [cname(v) for v in s.vars]
        self.emit(f"int {', '.join(names)};", depth)
        regs = ", ".join(f"%{k}" for k in range(len(names)))
        self.asm(f"ldmatrix.sync.aligned.m8n8.x{len(names)}{'.trans' if s.trans else ''}"
                 f".shared.b16 {{{regs}}}, [%{len(names)}];",
                 [f'"=r"({n})' for n in names], [f'"r"({self.smem_addr(s.buf, s.row)})'], depth)

    def pack_half2(self, s: PackHalf2, depth: int) -> None:
        lo, hi = strip_parens(self.expr(s.lo)), strip_parens(self.expr(s.hi))
        self.emit(f"int {cname(s.var)} = st_pack_{s.dtype}x2({lo}, {hi});", depth)

    def cp_async(self, s: CpAsync, depth: int) -> None:
        src = f"&{cname(s.src)}[{self.expr(s.src_index)}]"
        ins = [f'"r"({self.smem_addr(s.dst, s.dst_index)})', f'"l"({src})']
        size = f"{s.nbytes}"
        if s.src_bytes is not None:
            ins.append(f'"r"((unsigned){self.expr(s.src_bytes, UNARY)})')
            size += ", %2"
        self.asm(f"cp.async.{s.cache}.shared.global [%0], [%1], {size};", [], ins, depth)

    def prefetch_l2(self, s: PrefetchL2, depth: int) -> None:
        at = f"&{cname(s.buf)}[{strip_parens(self.expr(s.index))}]"
        self.emit(f"if (threadIdx.x == 0) st_prefetch_l2({at}, {s.nbytes});", depth)

    def cp_async_commit(self, s: CpAsyncCommit, depth: int) -> None:
        self.asm("cp.async.commit_group;", [], [], depth)

    def cp_async_wait(self, s: CpAsyncWait, depth: int) -> None:
        self.asm(f"cp.async.wait_group {s.pending};", [], [], depth)

    def atomic(self, s: Atomic, depth: int) -> None:
        t = self.bufs[s.buf]
        ptr, v = f"&{cname(s.buf)}[{strip_parens(self.expr(s.index))}]", strip_parens(self.expr(s.value))
        if t == "f32" and s.op != "add":
            self.emit(f"st_atomic_{s.op}({ptr}, {v});", depth)
        elif t == "i64" and s.op == "add":
            self.emit(f"atomicAdd((unsigned long long*){ptr}, (unsigned long long)({v}));", depth)
        else:
            fn = {"add": "atomicAdd", "max": "atomicMax", "min": "atomicMin"}[s.op]
            self.emit(f"{fn}({ptr}, ({dtypes.C_STORAGE[t]})({v}));", depth)

    def smem_addr(self, buf: str, index: Expr) -> str:
        return f"st_smem_addr(&{cname(buf)}[{strip_parens(self.expr(index))}])"

    def asm(self, text: str, outs: list[str], ins: list[str], depth: int, memory: bool = True) -> None:
        """One `asm volatile` statement. Those that touch memory also clobber it, so that the
        compiler keeps plain shared-memory accesses on their side of it."""
        if not outs and not ins:
            self.emit(f'asm volatile("{text}" ::: "memory");', depth)
            return
        pad = " " * len("asm volatile(")
        width = LINE - len(INDENT * depth + pad) - 2
        lines = [f'asm volatile("{text}"']
        if len(lines[0]) > width + len(pad) and " {" in text:     # mnemonic, then operands
            head, _, rest = text.partition(" {")
            lines = [f'asm volatile("{head} "', f'{pad}"{{{rest}"']
        for ops in (outs, ins):          # filled greedily, continuation lines under the first
            lines.append(f"{pad}:")
            for k, op in enumerate(ops):
                piece = op + ("," if k < len(ops) - 1 else "")
                if len(lines[-1]) > len(pad) + 1 and len(lines[-1]) + 1 + len(piece) > width + len(pad):
                    lines.append(f"{pad} ")
                lines[-1] += " " + piece
        if memory:
            lines.append(f'{pad}: "memory"')
        lines[-1] += ");"
        for line in lines:
            self.emit(line, depth)

    def mma(self, s: Mma, depth: int) -> None:
        """D = A @ B + C; with d == c the accumulators are read-write operands ("+f")."""
        d, a, b, c = ([cname(v) for v in vs] for vs in (s.d, s.a, s.b, s.c))
        t = s.dtype
        if d == c:
            outs, c_ops = [f'"+f"({v})' for v in d], _operands(0, 4)
            ins = [f'"r"({v})' for v in a + b]
        else:
            outs, c_ops = [f'"=f"({v})' for v in d], _operands(10, 4)
            ins = [f'"r"({v})' for v in a + b] + [f'"f"({v})' for v in c]
        self.asm(f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{_operands(0, 4)}}}, "
                 f"{{{_operands(4, 4)}}}, {{{_operands(8, 2)}}}, {{{c_ops}}};", outs, ins, depth,
                 memory=False)

    # TMA, mbarrier and wgmma: one asm statement each (waits call st_mbar_wait)

    def wgmma_fence(self, s: WgmmaFence, depth: int) -> None:
        self.asm("wgmma.fence.sync.aligned;", [], [], depth)

    def wgmma_commit(self, s: WgmmaCommit, depth: int) -> None:
        self.asm("wgmma.commit_group.sync.aligned;", [], [], depth)

    def wgmma_wait(self, s: WgmmaWait, depth: int) -> None:
        self.asm(f"wgmma.wait_group.sync.aligned {s.pending};", [], [], depth)

    def fence_proxy_async(self, s: FenceProxyAsync, depth: int) -> None:
        self.asm("fence.proxy.async.shared::cta;", [], [], depth)

    def mbar_init(self, s: MbarInit, depth: int) -> None:
        self.asm("mbarrier.init.shared::cta.b64 [%0], %1;", [],
                 [f'"r"({self.smem_addr(s.bar, s.index)})', f'"r"({s.count})'], depth)

    def mbar_arrive(self, s: MbarArrive, depth: int) -> None:
        bar = f'"r"({self.smem_addr(s.bar, s.index)})'
        if s.tx_bytes is None:
            self.asm("mbarrier.arrive.shared::cta.b64 _, [%0];", [], [bar], depth)
        else:
            self.asm("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;", [],
                     [bar, f'"r"({s.tx_bytes})'], depth)

    def mbar_try_wait(self, s: MbarTryWait, depth: int) -> None:
        self.emit(f"bool {cname(s.var)} = st_mbar_try_wait({self.smem_addr(s.bar, s.index)}, "
                  f"(unsigned){self.expr(s.parity, UNARY)});", depth)

    def mbar_wait(self, s: MbarWait, depth: int) -> None:
        self.emit(f"st_mbar_wait({self.smem_addr(s.bar, s.index)}, "
                  f"(unsigned){self.expr(s.parity, UNARY)});", depth)

    def tma_load(self, s: TmaLoad, depth: int) -> None:
        r = len(s.coords)
        coords = ", ".join(f"%{2 + j}" for j in range(r))
        self.asm(f"cp.async.bulk.tensor.{r}d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 f"[%0], [%1, {{{coords}}}], [%{2 + r}];", [],
                 [f'"r"({self.smem_addr(s.dst, s.dst_index)})',
                  f'"l"(reinterpret_cast<unsigned long long>(&{cname(s.tmap)}))',
                  *(f'"r"((int){self.expr(c, UNARY)})' for c in s.coords),
                  f'"r"({self.smem_addr(s.bar, s.bar_index)})'], depth)

    def wgmma(self, s: Wgmma, depth: int) -> None:
        """D = A @ B.T + D per warpgroup; scale-d is a predicate set from an int; imm-scale-a/b
        are 1, imm-trans-a/b are trans_a/trans_b (1: that operand MN-major; FP8 forms have no
        transpose operands). The empty asm
        after it ties the accumulators to the asynchronous instruction (the compiler must not
        move or copy them before wgmma.wait_group)."""
        d = [cname(v) for v in s.d]
        nd = len(d)
        scale = "1" if s.scale_d is None else self.expr(s.scale_d, UNARY)
        ptx = ".".join([_PTX_TYPE.get(s.dtype, s.dtype)] * 2)
        if s.a_regs:        # A's fragment registers: no imm-trans-a
            a, na = f"{{{_operands(nd, 4)}}}", 4
            ins = [f'"r"({cname(v)})' for v in s.a_regs]
            trans = f", {int(s.trans_b)}"
        else:
            a, na = f"%{nd}", 1
            ins = [f'"l"({strip_parens(self.expr(s.a))})']
            trans = "" if s.dtype in dtypes.FLOAT8 else f", {int(s.trans_a)}, {int(s.trans_b)}"
        self.asm(f"{{ .reg .pred p; setp.ne.b32 p, %{nd + na + 1}, 0; "
                 f"wgmma.mma_async.sync.aligned.m64n{s.n}k{s.k}.f32.{ptx} "
                 f"{{{_operands(0, nd)}}}, {a}, %{nd + na}, p, 1, 1{trans}; }}",
                 [f'"+f"({v})' for v in d],
                 ins + [f'"l"({strip_parens(self.expr(s.b))})', f'"r"((int){scale})'], depth)
        self.asm("", [f'"+f"({v})' for v in d] + [f'"+r"({cname(v)})' for v in s.a_regs], [], depth)

    def stored(self, buf: str, value: Expr) -> str:
        conv = self.to_storage.get(self.bufs.get(buf, ""))
        return f"{conv}({self.expr(value)})" if conv else strip_parens(self.expr(value))

    def load_vec(self, s: LoadVec, depth: int) -> None:
        sd, w = self.bufs[s.buf], len(s.vars)
        names = [cname(v) for v in s.vars]
        t = self.ctype(s.vars[0], s.dtype)
        at = f"&{cname(s.buf)}[{self.expr(s.index)}]"
        if w == 1:
            self.emit(f"{t} {names[0]} = {self.ex(Load(s.buf, s.index, s.dtype))[0]};", depth)
            return
        raw = f"{names[0]}_v{w}"
        vt = _F32_VEC.get(w) if sd == "f32" else _INT_VEC.get((sd, w))
        if vt:                          # float2/float4, int2/int4, longlong2: by field
            self.emit(f"const {vt} {raw} = *reinterpret_cast<const {vt}*>({at});", depth)
            for n, f in zip(names, "xyzw"):
                self.emit(f"{t} {n} = {raw}.{f};", depth)
            return
        nbytes = w * dtypes.ITEMSIZE[sd]
        carrier = _CARRIER.get(nbytes)
        if carrier is None:
            raise TypeError(f"{self.k.name}: no {nbytes}-byte vector access for {s.buf}")
        self.emit(f"const {carrier} {raw} = *reinterpret_cast<const {carrier}*>({at});", depth)
        if sd in _HALF2 and w % 2 == 0:
            h2 = _HALF2[sd]
            self.emit(f"const {h2}* {raw}_h2 = reinterpret_cast<const {h2}*>(&{raw});", depth)
            for k, n in enumerate(names):
                self.emit(f"{t} {n} = {'__high2float' if k % 2 else '__low2float'}({raw}_h2[{k // 2}]);",
                          depth)
            return
        et = dtypes.C_STORAGE[sd]
        self.emit(f"const {et}* {raw}_e = reinterpret_cast<const {et}*>(&{raw});", depth)
        conv = self.to_float.get(sd)
        for k, n in enumerate(names):
            self.emit(f"{t} {n} = {f'{conv}({raw}_e[{k}])' if conv else f'{raw}_e[{k}]'};", depth)

    def store_vec(self, s: StoreVec, depth: int) -> None:
        sd, w = self.bufs[s.buf], len(s.values)
        vals = [strip_parens(self.expr(v)) for v in s.values]
        at = f"&{cname(s.buf)}[{self.expr(s.index)}]"
        if w == 1:
            self.emit(f"{cname(s.buf)}[{self.expr(s.index)}] = {self.stored(s.buf, s.values[0])};", depth)
            return
        if (sd, w) in _MAKE_VEC:
            vt = _F32_VEC.get(w) if sd == "f32" else _INT_VEC[sd, w]
            self.emit(f"*reinterpret_cast<{vt}*>({at}) = {_MAKE_VEC[sd, w]}({', '.join(vals)});", depth)
            return
        nbytes = w * dtypes.ITEMSIZE[sd]
        carrier = _CARRIER.get(nbytes)
        if carrier is None:
            raise TypeError(f"{self.k.name}: no {nbytes}-byte vector access for {s.buf}")
        if sd in _HALF2 and w == 2:
            self.emit(f"*reinterpret_cast<{_HALF2[sd]}*>({at}) = {_PACK2[sd]}({vals[0]}, {vals[1]});",
                      depth)
            return
        raw = f"{cname(s.buf)}_v{w}"
        self.emit("{", depth)
        self.emit(f"{carrier} {raw};", depth + 1)
        if sd in _HALF2 and w % 2 == 0:
            h2 = _HALF2[sd]
            self.emit(f"{h2}* {raw}_h2 = reinterpret_cast<{h2}*>(&{raw});", depth + 1)
            for k in range(0, w, 2):
                self.emit(f"{raw}_h2[{k // 2}] = {_PACK2[sd]}({vals[k]}, {vals[k + 1]});", depth + 1)
        else:
            et = dtypes.C_STORAGE[sd]
            conv = self.to_storage.get(sd)
            self.emit(f"{et}* {raw}_e = reinterpret_cast<{et}*>(&{raw});", depth + 1)
            for k, v in enumerate(vals):
                self.emit(f"{raw}_e[{k}] = {f'{conv}({v})' if conv else v};", depth + 1)
        self.emit(f"*reinterpret_cast<{carrier}*>({at}) = {raw};", depth + 1)
        self.emit("}", depth)

    # ------------------------------------------------------------ the kernel

    def hoisted_smem(self) -> set[str]:
        """Shared arrays declared in a nested block, or used before their declaration: they are
        declared at the top of the kernel so that C scoping matches Kernel IR's."""
        hoist = {s.name for s in walk(self.k.body) if isinstance(s, Smem)}
        seen: set[str] = set()
        for s in self.k.body:
            if isinstance(s, Smem):
                if s.name in hoist and s.name not in seen:
                    hoist.discard(s.name)
                seen.add(s.name)
                continue
            for name in _buffers_used(s):
                seen.add(name)
        return hoist

    def dynamic_smem(self) -> None:
        """The dynamic shared arrays (Smem.dynamic): one extern array whose base is rounded up to
        DYNAMIC_SMEM_ALIGN at run time (the launch passes that much slack, see
        Kernel.dynamic_smem_bytes), each array at an aligned offset in declaration order."""
        at, self.dyn_offsets = 0, {}
        for s in walk(self.k.body):
            if isinstance(s, Smem) and s.dynamic and s.name not in self.dyn_offsets:
                self.dyn_offsets[s.name] = at
                at += -(-s.size * dtypes.ITEMSIZE[s.dtype] // DYNAMIC_SMEM_ALIGN) * DYNAMIC_SMEM_ALIGN
        if self.dyn_offsets:
            a = DYNAMIC_SMEM_ALIGN
            self.emit(f"extern __shared__ __align__({a}) unsigned char st_dyn_smem_raw[];", 1)
            self.emit(f"unsigned char* st_dyn_smem = st_dyn_smem_raw + (({a}u - "
                      f"((unsigned)__cvta_generic_to_shared(st_dyn_smem_raw) & {a - 1}u)) & {a - 1}u);", 1)

    def kernel(self) -> str:
        k = self.k
        params = [f"{'' if p.output else 'const '}{dtypes.C_STORAGE[p.dtype]}* __restrict__ {cname(p.name)}"
                  if p.tensor_map is None else
                  f"const __grid_constant__ st_tensor_map {cname(p.name)}" for p in k.params]
        params += [f"{dtypes.C_STORAGE[t]} {cname(n)}" for n, t in k.scalars]
        for line in (k.src or "").splitlines():
            self.lines.append(f"// {line}")
        if self.wide:
            self.lines.append("// indices reach 2^31: index arithmetic in long long")
        head = f'extern "C" __global__ void __launch_bounds__({k.block})'
        sig = f"{cname(k.name)}({', '.join(params)}) {{"
        if len(head) + 1 + len(sig) <= LINE:
            self.lines.append(f"{head} {sig}")
        else:
            self.lines.append(head)
            self.wrap_signature(cname(k.name), params)
        self.hoisted = self.hoisted_smem()
        self.dynamic_smem()
        for name in sorted(self.hoisted):
            self.stmt(self.smem[name], 1)
        early = leading(k.body)          # weights asked of L2 before the wait
        self.body(k.body[:early], 1)
        self.emit("st_grid_dependency();", 1)
        self.body(k.body[early:], 1)
        self.lines.append("}")
        return "\n".join(self.lines)

def _async_proxy_bufs(kernel: Kernel) -> set[str]:
    """Shared arrays TMA writes or wgmma descriptors point into (the swizzle acts on address bits,
    so they start on a 1024-byte boundary, as the simulator assumes)."""
    return ({s.dst for s in walk(kernel.body) if isinstance(s, TmaLoad)}
            | {x.buf for s in walk(kernel.body) for e in s.exprs() for x in nodes(e)
               if isinstance(x, WgmmaDesc)})


def _operands(first: int, n: int) -> str:
    """'%first, ..., %(first + n - 1)': asm operand numbers."""
    return ", ".join(f"%{first + k}" for k in range(n))


def _buffers_used(s) -> set[str]:
    """Every array `s` and its bodies name: themselves, in a load or in a wgmma descriptor."""
    return {name for st in walk([s]) for name in st.buffers()} | {
        x.buf for st in walk([s]) for e in st.exprs() for x in nodes(e)
        if isinstance(x, (Load, WgmmaDesc))}


# ---------------------------------------------------------------- public entry points

def emit_kernel(kernel: Kernel) -> str:
    """CUDA C for one kernel (needs the includes and prelude of `emit_program` to compile)."""
    refuse_unprintable(kernel, "cuda", "CUDA cannot run: it is a CPU's (the C target's)")
    return CudaEmitter(kernel).kernel()


def emit_source(kernels: list[Kernel], arch: Target | str = "sm_90") -> str:
    """Hand-written kernels as one translation unit (codegen's registry)."""
    return emit_program(KernelProgram([], list(kernels), []), arch)


def emit_program(program: KernelProgram, arch: Target | str = "sm_90") -> str:
    """One translation unit: headers, the st_* helpers, then every kernel in launch order."""
    target = get_target(arch)
    names = ", ".join(k.name for k in program.kernels)
    parts = [f"// strata: {len(program.kernels)} kernel(s) for {target}: {names}",
             "#include <cuda_fp16.h>\n#include <cuda_bf16.h>",
             PRELUDE.rstrip()]
    if any(isinstance(s, Atomic) for k in program.kernels for s in walk(k.body)):
        parts.append(ATOMIC_PRELUDE)
    users = [k.name for k in program.kernels
             if any(isinstance(s, WARP_OPS + HOPPER_STMTS) for s in walk(k.body))]
    hopper = [k.name for k in program.kernels if any(isinstance(s, HOPPER_STMTS) for s in walk(k.body))]
    wgmma = [k.name for k in program.kernels if any(isinstance(s, Wgmma) for s in walk(k.body))]
    if not target.is_gpu:
        raise CompileError(f"CUDA is for GPU targets, not {target}")
    if hopper and not target.has("tma"):
        raise CompileError(f"kernel {hopper[0]} uses TMA, mbarrier or wgmma, which need sm_90 or "
                           f"newer, not {target}")
    if wgmma and not target.has("wgmma"):
        raise CompileError(f"kernel {wgmma[0]} uses wgmma, which needs sm_90a, not {target}")
    if users:
        if not target.has("mma.sync"):
            raise CompileError(f"kernel {users[0]} uses mma.sync, ldmatrix or cp.async, which need "
                               f"sm_80 or newer, not {target}")
        parts.append(TENSOR_CORE_PRELUDE.rstrip())
    if any(isinstance(s, PackHalf2) for k in program.kernels for s in walk(k.body)):
        parts.append(PACK_PRELUDE.rstrip())
    if hopper:
        parts.append(HOPPER_PRELUDE.rstrip())
    if wgmma:
        parts.append(WGMMA_GUARD)
    parts += [emit_kernel(k) for k in distinct_kernels(program)]
    return "\n\n".join(parts) + "\n"
