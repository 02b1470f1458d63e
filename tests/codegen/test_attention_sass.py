"""The flash-attention forward on mma.sync, read in the machine code without a GPU (issue 54).

Why: on the H200 (2026-12-01) causal attention at 2048 x 64 ran at 0.19x PyTorch's flash SDPA;
its kernel filled K and V one 2-byte load and shared store per element and passed P through
shared memory between two barriers. Now K and V come by cp.async, 16 bytes a thread
(LDGSTS.128; the only 16-bit global loads are Q's, once a block), P's A fragments are packed in
registers (no shared store per score), K and V double-buffered where two buffers fit (head dim
64: the next key block's copies under this block's products), and nothing spills. Speed is for a
GPU to say.
"""
import re

import pytest
import torch

from conftest import skip_unless_sass_readable

skip_unless_sass_readable()

import strata  # noqa: E402
from strata.core.context import Context  # noqa: E402
from strata.runtime.nvrtc import resource_usage  # noqa: E402
from strata.kernel_ir.ir import Smem, walk  # noqa: E402
from strata.runtime.sass import global_loads, sass  # noqa: E402
from strata.tile.attention import MMA_PAD  # noqa: E402

ARCH = "sm_90a"


@pytest.mark.parametrize("causal,d", [(True, 64), (False, 128)])
def test_attention_copies_k_and_v_by_cp_async_and_keeps_p_in_registers(causal, d):
    qkv = tuple(torch.randn(1, 32, 2048, d, dtype=torch.bfloat16) for _ in range(3))
    prog = strata.compile(
        lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
        qkv, device="sim", ctx=Context(target=ARCH))
    (kernel,) = prog.lowered.tile.kernels
    source = prog.source("cuda")
    code, use = sass(source, ARCH)[kernel.name], resource_usage(source, ARCH)[kernel.name]
    loads = global_loads(code)
    assert "HMMA" in code and "LDGSTS.E.BYPASS.128" in code
    q_fill = -(-kernel.attention.block_m * d // kernel.block)      # Q's elements a thread
    assert loads.get(16, 0) <= q_fill, loads
    assert len(re.findall(r"\bSTS\b", code)) <= q_fill, "P or K/V still stored to shared memory"
    assert use["spill_stores"] == use["spill_loads"] == 0, use
    smem = {x.name: x.size for k in prog.lowered.kernel.kernels for x in walk(k.body)
            if isinstance(x, Smem)}
    buffers = 2 if d == 64 else 1        # head dim 128: two K/V buffers would pass 48 KB
    assert smem["k_tile"] == buffers * kernel.attention.block_n * (d + MMA_PAD), smem


@pytest.mark.parametrize("causal,d", [(True, 64), (False, 128)])
def test_wgmma_attention_runs_both_products_on_hgmma(causal, d):
    """INSTR=wgmma (kernel_ir/lower_attention_wgmma.py): HGMMA and no HMMA, K and V still by
    LDGSTS.128, no spills and no ptxas warning that the wgmmas serialize (C7514-like)."""
    from strata.runtime.nvrtc import ptxas_log
    qkv = tuple(torch.randn(1, 32, 2048, d, dtype=torch.bfloat16) for _ in range(3))
    prog = strata.compile(
        lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
        qkv, device="sim", ctx=Context(target=ARCH, knobs={"INSTR": "wgmma"}))
    (kernel,) = prog.lowered.tile.kernels
    source = prog.source("cuda")
    code, use = sass(source, ARCH)[kernel.name], resource_usage(source, ARCH)[kernel.name]
    assert "HGMMA" in code and not re.search(r"\bHMMA", code) and "LDGSTS.E.BYPASS.128" in code
    assert "FENCE.VIEW.ASYNC.S" in code         # K/V's copies fenced for wgmma's async proxy
    assert use["spill_stores"] == use["spill_loads"] == 0, use
    assert "Performance Loss" not in ptxas_log(source, ARCH)
    # static shared memory is Q's tile only: K and V (two buffers each) are dynamic
    assert use["smem"] == kernel.attention.block_m * (d + MMA_PAD) * 2, use
    assert kernel.attention.kv_stages == 2 and prog.lowered.kernel.kernels[0].dynamic_smem_bytes \
        >= 2 * kernel.attention.block_n * 2 * d * 2
