"""Hand-built Hopper kernels: global -> TMA (128B swizzle) -> shared -> wgmma -> global, with an
mbarrier per stage, written the way a tile schedule is expected to write them, for the
simulator and NVRTC tests. Also a TMA probe that exposes the box layout in shared memory.

C = A @ B.T with A (m, k) and B (n, k) row-major bf16 (both K-major, as wgmma reads them without
transposes: B is laid out like nn.Linear's weight), C (m, n) f32. One warpgroup computes a 64 x bn
block tile; the K loop runs over 64-wide slabs (128 bytes of bf16: one 128B-swizzle row), each
slab four wgmma k16 steps whose descriptors advance by 32 bytes."""
from __future__ import annotations

from kernel_builders import I, V, program

from strata.core import dtypes
from strata.core import expr as E
from strata.core.dtypes import compute_dtype
from strata.kernel_ir.ir import (
    BlockIdx,
    Buffer,
    FenceProxyAsync,
    For,
    If,
    Kernel,
    KernelProgram,
    Let,
    Load,
    MbarArrive,
    MbarInit,
    MbarTryWait,
    MbarWait,
    Param,
    Smem,
    Store,
    StoreVec,
    Sync,
    TensorMap,
    ThreadIdx,
    TmaLoad,
    Wgmma,
    WgmmaCommit,
    WgmmaDesc,
    WgmmaFence,
    WgmmaWait,
)

BM, BK = 64, 64


def regs(name: str, n: int) -> tuple[str, ...]:
    return tuple(f"{name}{r}" for r in range(n))


def tensor_map(rows: int, cols: int, box_rows: int, box_cols: int, swizzle: str,
               item: int = 2) -> TensorMap:
    """A row-major (rows, cols) matrix, innermost first as the CUDA API takes it."""
    return TensorMap((cols, rows), (cols * item,), (box_cols, box_rows), swizzle)


def c_layout(i: int, w, g, t):
    """(row, col) in the 64 x n tile of accumulator d[i] (PTX wgmma D fragment)."""
    return E.add(E.add(E.mul(w, 16), g), 8 * ((i >> 1) & 1)), E.add(E.mul(t, 2), 8 * (i >> 2))


def wgmma_gemm(m: int = 64, n: int = 64, k: int = 64, bn: int = 64, stages: int = 2,
               swizzle: str = "128B", desc_swizzle: str | None = None, layout=c_layout,
               name: str | None = None, b_kn: bool = False, b_lbo: int | None = None,
               b_sbo: int | None = None, trans_b: bool | None = None) -> KernelProgram:
    """C = A @ B.T; grid = cdiv(m, 64) * (n / bn) blocks of one warpgroup (128 threads).

    b_kn: B is stored (k, n) row-major instead (C = A @ B, N contiguous: `torch.mm(a, b)`), read
    N-major (imm-trans-b = 1, 128B swizzle only): per slab, bn / 64 TMA boxes of 64 n x 64 k (a
    128-byte row of n per k), box j at j * 8192 bytes, so LBO (between the 64-wide n runs) is
    8192 bytes and SBO (between groups of 8 k rows) 1024; a k16 step moves the descriptor 16
    rows of 128 bytes. b_lbo, b_sbo, trans_b override what B's descriptors and wgmmas say.

    Thread 0 initialises one mbarrier per stage and issues, per slab, arrive.expect_tx(bytes) and
    two TMA loads; the first `stages` slabs before the loop, slab kt + stages after slab kt has
    been consumed (wgmma.wait_group 0, then a Sync so that no warp still reads the stage). Every
    thread waits on the stage's barrier with parity (kt / stages) % 2. Rows past m and K past k
    are zero-filled by TMA; rows past m are not stored."""
    assert n % bn == 0 and k % 8 == 0 and bn % 8 == 0 and bn <= 256
    assert not b_kn or (bn % 64 == 0 and swizzle == "128B")
    desc_swizzle = desc_swizzle or swizzle
    kn_box = 64 * BK                          # elements of one (64 n, 64 k) box of B
    tid, kt = V("tid", "i32"), V("kt", "i32")
    bm, bnn, st = V("bm", "i32"), V("bn", "i32"), V("s", "i32")
    ktiles = -(-k // BK)
    stages = min(stages, ktiles)
    ksteps = min(BK, -(-k // 16) * 16) // 16      # k16 steps per slab (fewer when k < 64)
    a_slab, b_slab = BM * BK, bn * BK
    nbytes = (a_slab + b_slab) * 2
    acc = regs("d", bn // 2)

    def load(kt_e, stage_e):
        return (MbarArrive("bar", stage_e, nbytes),
                TmaLoad("a_s", E.mul(stage_e, a_slab), "A", (E.mul(kt_e, BK), E.mul(bm, BM)),
                        "bar", stage_e),
                *((TmaLoad("b_s", E.add(E.mul(stage_e, b_slab), j * kn_box), "B",
                           (E.add(E.mul(bnn, bn), 64 * j), E.mul(kt_e, BK)), "bar", stage_e)
                   for j in range(bn // 64)) if b_kn else
                  (TmaLoad("b_s", E.mul(stage_e, b_slab), "B", (E.mul(kt_e, BK), E.mul(bnn, bn)),
                           "bar", stage_e),)))

    is0 = E.call("eq", tid, I(0))
    step = [MbarWait("bar", st, E.mod(E.floordiv(kt, stages), 2)),
            WgmmaFence(),
            Let("da", "i64", WgmmaDesc("a_s", E.mul(st, a_slab), 16, 1024, desc_swizzle)),
            Let("db", "i64", WgmmaDesc("b_s", E.mul(st, b_slab),
                                       b_lbo if b_lbo is not None else 2 * kn_box if b_kn else 16,
                                       b_sbo if b_sbo is not None else 1024, desc_swizzle))]
    b_step = 128 if b_kn else 2     # per k16: 16 rows of 128 bytes (N-major), or 32 bytes
    for kk in range(ksteps):        # (K-major), in the descriptor's 16-byte address units
        step.append(Wgmma(acc, E.add(V("da", "i64"), I(2 * kk)),
                          E.add(V("db", "i64"), I(b_step * kk)), bn, "bf16",
                          trans_b=b_kn if trans_b is None else trans_b))
    step += [WgmmaCommit(), WgmmaWait(0), Sync()]
    if ktiles > stages:
        refill = E.call("logical_and", is0, E.call("lt", E.add(kt, stages), I(ktiles)))
        step.append(If(refill, load(E.add(kt, stages), st)))
    body = [
        Let("tid", "i32", ThreadIdx()),
        Let("bm", "i32", E.floordiv(BlockIdx(), n // bn)),
        Let("bn", "i32", E.mod(BlockIdx(), n // bn)),
        Smem("a_s", "bf16", stages * a_slab),
        Smem("b_s", "bf16", stages * b_slab),
        Smem("bar", "i64", stages),
        If(is0, (*(MbarInit("bar", I(s), 1) for s in range(stages)), FenceProxyAsync())),
        Sync(),
        If(is0, tuple(x for t in range(min(stages, ktiles)) for x in load(I(t), I(t)))),
        *(Let(v, "f32", E.Const(0.0, "f32")) for v in acc),
        For("kt", I(0), I(ktiles), 1, (Let("s", "i32", E.mod(kt, stages)), *step)),
        Let("w", "i32", E.floordiv(tid, 32)),
        Let("g", "i32", E.floordiv(E.mod(tid, 32), 4)),
        Let("t", "i32", E.mod(tid, 4)),
    ]
    w, g, t = V("w", "i32"), V("g", "i32"), V("t", "i32")
    for i in range(0, bn // 2, 2):
        r, c = layout(i, w, g, t)
        row, col = E.add(E.mul(bm, BM), r), E.add(E.mul(bnn, bn), c)
        store = StoreVec("C", E.add(E.mul(row, n), col), (V(acc[i], "f32"), V(acc[i + 1], "f32")))
        body.append(If(E.call("lt", row, I(m)), (store,)) if m % BM else store)
    params = (Param("A", "bf16", m * k, tensor_map=tensor_map(m, k, BM, BK, swizzle)),
              Param("B", "bf16", n * k, tensor_map=tensor_map(k, n, BK, 64, swizzle) if b_kn
                    else tensor_map(n, k, bn, BK, swizzle)),
              Param("C", "f32", m * n, output=True))
    grid = -(-m // BM) * (n // bn)
    kern = Kernel(name or f"k_wgmma_{m}x{n}x{k}", params, grid, 128, tuple(body),
                  src=f"C = A @ B.T, {m}x{n}x{k} bf16, 64x{bn} tiles, one warpgroup, "
                      f"{stages}-stage TMA/mbarrier, {swizzle} swizzle")
    return program(kern, [Buffer("A", "bf16", (m, k), "input"),
                          Buffer("B", "bf16", (k, n) if b_kn else (n, k), "input"),
                          Buffer("C", "f32", (m, n), "output")])


def tma_probe(rows: int, cols: int, box_rows: int, box_cols: int, coords: tuple[int, int],
              swizzle: str, dtype: str = "bf16", extra_tx: int = 0, try_wait: bool = False,
              read: bool = True) -> KernelProgram:
    """One TMA box of X (rows, cols) at `coords` (col, row) into shared s, then out[e] = s[e]: the
    raw shared layout. extra_tx bytes more are expected than the copy brings (the phase never
    completes); try_wait: probe with MbarTryWait into flag[0] instead of blocking; read=False
    skips reading s."""
    item = dtypes.ITEMSIZE[dtype]
    n = box_rows * box_cols
    tid = V("tid", "i32")
    is0 = E.call("eq", tid, I(0))
    body = [Let("tid", "i32", ThreadIdx()), Smem("s", dtype, n), Smem("bar", "i64", 1),
            If(is0, (MbarInit("bar", I(0), 1), FenceProxyAsync())), Sync(),
            If(is0, (MbarArrive("bar", I(0), n * item + extra_tx),
                     TmaLoad("s", I(0), "X", (I(coords[0]), I(coords[1])), "bar", I(0))))]
    if try_wait:
        body += [MbarTryWait("ok", "bar", I(0), I(0)),
                 If(is0, (Store("flag", I(0), E.call("where", V("ok", "bool"), I(1), I(0))),))]
    else:
        body.append(MbarWait("bar", I(0), I(0)))
    if read:
        e = V("e", "i32")
        body.append(For("e", tid, I(n), 128, (Store("out", e, Load("s", e, compute_dtype(dtype))),)))
    params = [Param("X", dtype, rows * cols, tensor_map=tensor_map(rows, cols, box_rows, box_cols,
                                                                   swizzle, item)),
              Param("out", dtype, n, output=True)]
    bufs = [Buffer("X", dtype, (rows, cols), "input"), Buffer("out", dtype, (n,), "output")]
    if try_wait:
        params.append(Param("flag", "i32", 1, output=True))
        bufs.append(Buffer("flag", "i32", (1,), "output"))
    k = Kernel("k_tma_probe", tuple(params), 1, 128, tuple(body))
    return program(k, bufs)

