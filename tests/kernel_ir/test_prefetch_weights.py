"""Weights asked of L2 before a kernel waits for the one before it (kernel_ir/prefetch_weights.py,
issue 53 item 2): on sm_90+ every kernel that reads a weight starts with one bulk prefetch per
weight, each block its own 16-byte-aligned share inside the buffer, at most L2_PREFETCH KiB per
kernel, before `st_grid_dependency()`; never a buffer the program writes, never on older GPUs
or other targets; the simulator and the verifier hold the statement to that."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import strata
from strata.core import dtypes
from strata.core.context import Context
from strata.core.expr import Const, mul
from strata.kernel_ir.ir import BlockIdx, PrefetchL2
from strata.kernel_ir.prefetch_weights import default_kib, leading
from strata.kernel_ir.sim import SimError, run_kernel, storage_numpy
from strata.kernel_ir.verify import KernelVerifyError, verify_program


def _compile(k=2048, n=2048, m=1, **ctx):
    layer = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16).eval()
    x = torch.randn(m, k, dtype=torch.bfloat16)
    with torch.no_grad():
        prog = strata.compile(layer, (x,), device="sim", ctx=Context(**{"target": "sm_90a", **ctx}))
        got, want = prog(x).float(), layer(x).float()
    return prog, got, want


def _heads(prog):
    return {k.name: k.body[:leading(k.body)] for k in prog.lowered.kernel.kernels}


@pytest.mark.parametrize("k,n", [(2048, 2048), (5632, 2048), (2048, 256)])
def test_each_block_asks_for_its_share_of_the_weight_before_the_grid_dependency(k, n):
    prog, got, want = _compile(k, n)
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2)           # the sim ran them
    kp = prog.lowered.kernel
    kinds = {b.name: b.kind for b in kp.buffers}
    cap = default_kib(Context(target="sm_90a").arch) * 1024
    heads = _heads(prog)
    readers = [kk for kk in kp.kernels if "p_weight" in {p.name for p in kk.params}]
    assert readers
    for kk in kp.kernels:
        head = heads[kk.name]
        assert all(kinds[s.buf] == "weight" for s in head), f"{kk.name} prefetches {head}"
        if kk not in readers:
            assert not head
            continue
        (pre,) = head
        p = {q.name: q for q in kk.params}["p_weight"]
        size = dtypes.ITEMSIZE[p.dtype]
        assert pre.nbytes % 16 == 0 and pre.nbytes * kk.grid <= cap
        share = p.numel * size // kk.grid // 16 * 16
        assert pre.index == mul(BlockIdx(), Const(share // size)) and 16 <= pre.nbytes <= share
        code = prog.source("cuda")
        body = code[code.index(f"{kk.name}("):]
        assert body.index("st_prefetch_l2(") < body.index("st_grid_dependency();")


def test_a_pin_sets_the_amount_and_zero_or_an_older_gpu_asks_for_none():
    prog, *_ = _compile(knobs={"L2_PREFETCH": 64})
    heads = _heads(prog)
    assert any(heads.values())
    assert all(sum(s.nbytes for s in heads[kk.name]) * kk.grid <= 64 * 1024
               for kk in prog.lowered.kernel.kernels)
    for ctx in ({"knobs": {"L2_PREFETCH": 0}}, {"target": "sm_80"}):
        prog, got, want = _compile(**ctx)
        assert not any(_heads(prog).values())
        assert "st_prefetch_l2(&" not in prog.source("cuda")
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2)


def test_the_verifier_refuses_an_early_prefetch_of_what_the_program_writes():
    prog, *_ = _compile()
    kp = prog.lowered.kernel
    out = next(p for kk in kp.kernels for p in kk.params if p.output)
    first = next(kk for kk in kp.kernels if out.name in {p.name for p in kk.params})
    bad = replace(first, body=(PrefetchL2(out.name, Const(0), 16), *first.body))
    with pytest.raises(KernelVerifyError, match="before it waits"):
        verify_program(replace(kp, kernels=[bad if kk is first else kk for kk in kp.kernels]))


@pytest.mark.parametrize("nbytes,offset,why", [(32, 1, "16-byte boundary"), (24, 0, "16-byte"),
                                               (64, None, "out-of-bounds prefetch")])
def test_the_simulator_holds_a_prefetch_to_its_buffer(nbytes, offset, why):
    prog, *_ = _compile()
    kk = next(k for k in prog.lowered.kernel.kernels if leading(k.body))
    p = {q.name: q for q in kk.params}["p_weight"]
    # offset None: the last block's range runs past the end
    index = Const(offset) if offset is not None else mul(BlockIdx(), Const(p.numel // kk.grid))
    if offset is None:
        nbytes = 2 * p.numel * dtypes.ITEMSIZE[p.dtype] // kk.grid
    bad = replace(kk, body=(PrefetchL2("p_weight", index, nbytes), *kk.body[leading(kk.body):]))
    buffers = {q.name: np.zeros(q.numel, storage_numpy(q.dtype)) for q in kk.params}
    with pytest.raises(SimError, match=why):
        run_kernel(bad, buffers)
