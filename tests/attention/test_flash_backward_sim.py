"""strata::attention (out and each row's log-sum-exp) as one flash kernel, and its backward as
flash kernels of the sum form: dq, dk and dv each one kernel that rebuilds the weights from q, k
and the log-sum-exp, no Lq x Lk buffer anywhere. Through the simulator (and NVRTC where it is
installed, and natively on the CPU unfused), against eager float64 of the ops' torch bodies."""
import pytest
import torch
from attention_helpers import check_fused
from conftest import run_and_compare

from strata.core.context import Context
from strata.core.errors import KnobError
from strata.torch_compile import attention_op  # noqa: F401  (registers the ops)

ops = torch.ops.strata


def _qkv(b, hq, hk, lq, lk, d, dv=None, dtype=torch.float32):
    dv = dv or d
    return (torch.randn(b, hq, lq, d, dtype=dtype), torch.randn(b, hk, lk, d, dtype=dtype),
            torch.randn(b, hk, lk, dv, dtype=dtype))


def _backward_inputs(q, k, v, scale, causal, mask=None):
    out, lse = ops.attention(q, k, v, mask, scale, causal)
    return (torch.randn_like(out), q, k, v, out, lse) + ((mask,) if mask is not None else ())


def _attention_kernels(prog) -> list:
    return [t.attention.op for t in prog.lowered.tile.kernels if t.mode == "attention"]


def _no_square_buffer(prog, lq, lk):
    big = [b.name for b in prog.lowered.kernel.buffers
           if b.kind == "temp" and lq * lk > 1 and len(b.shape) >= 2 and tuple(b.shape[-2:]) in
           ((lq, lk), (lk, lq))]
    assert not big, f"weights stored: {big}"


def test_bf16_forward_writes_the_lse_from_the_tensor_core_schedule():
    def fn(q, k, v):
        return ops.attention(q, k, v, None, 0.3, True)
    prog = check_fused(fn, _qkv(2, 2, 2, 40, 40, 16, dtype=torch.bfloat16))
    (tk,) = [t for t in prog.lowered.tile.kernels if t.mode == "attention"]
    assert dict(tk.knobs)["INSTR"] == "mma" and tk.attention.op.lse is not None


@pytest.mark.parametrize("lq,lk,causal", [(1, 1, True), (7, 33, True), (33, 7, True),
                                          (19, 19, False)])
def test_forward_writes_out_and_lse_in_one_kernel(lq, lk, causal):
    def fn(q, k, v):
        return ops.attention(q, k, v, None, 0.3, causal)
    prog = check_fused(fn, _qkv(2, 2, 2, lq, lk, 16))
    (op,) = _attention_kernels(prog)
    assert op.norm == "softmax" and op.lse is not None


# (one key makes dq exactly 0 in exact arithmetic: a rounding-error result, not a test)
@pytest.mark.parametrize("lq,lk,causal", [(1, 6, False), (7, 33, True), (33, 7, True),
                                          (19, 19, False)])
def test_backward_is_three_flash_kernels_and_a_row_sum(lq, lk, causal):
    def fn(g, q, k, v, out, lse):
        return ops.attention_backward(g, q, k, v, None, out, lse, 0.3, causal)
    prog = run_and_compare(fn, _backward_inputs(*_qkv(2, 2, 2, lq, lk, 16), 0.3, causal),
                           contraction=True)
    fused = _attention_kernels(prog)
    assert len(fused) == 3 and all(op.norm == "sum" for op in fused)
    assert sorted(op.q2 is not None for op in fused) == [False, True, True]   # dv; dq and dk
    # causal: dq's key loop stops at the diagonal, dk's and dv's query loops start there
    bounds = sorted(str(t.attention.causal and t.attention.causal.lower)
                    for t in prog.lowered.tile.kernels if t.mode == "attention")
    assert bounds == (["False", "True", "True"] if causal else ["None"] * 3)
    assert len(prog.lowered.kernel.kernels) == 4, [k.name for k in prog.lowered.kernel.kernels]
    _no_square_buffer(prog, lq, lk)


def test_causal_backward_skips_blocks_on_both_sides_of_the_diagonal():
    """Small blocks over 70 positions: dq's later key blocks and dk's, dv's earlier query
    blocks are never visited, and the gradients still match."""
    def fn(g, q, k, v, out, lse):
        return ops.attention_backward(g, q, k, v, None, out, lse, 0.3, True)
    inputs = _backward_inputs(*_qkv(1, 2, 2, 70, 70, 8), 0.3, True)
    run_and_compare(fn, inputs, contraction=True, native=False,
                    ctx=Context(knobs={"BLOCK_M": 16, "BLOCK_N": 16}))


def test_backward_with_gqa_and_head_dims_that_differ():
    """dk and dv at the query heads, then summed over each KV head's group."""
    def fn(g, q, k, v, out, lse):
        return ops.attention_backward(g, q, k, v, None, out, lse, 0.25, True)
    q, k, v = _qkv(1, 6, 2, 9, 9, 16, 24)
    prog = run_and_compare(fn, _backward_inputs(q, k, v, 0.25, True), contraction=True)
    assert len(_attention_kernels(prog)) == 3
    _no_square_buffer(prog, 9, 9)


@pytest.mark.parametrize("causal", [True, False])
def test_bf16_backward_runs_on_tensor_cores(causal):
    """mma.sync for both scores and the product with the weights, dk's and dq's second score
    (g @ v^T) too; against float64 at bf16's tolerance."""
    def fn(g, q, k, v, out, lse):
        return ops.attention_backward(g, q, k, v, None, out, lse, 0.3, causal)
    inputs = _backward_inputs(*_qkv(1, 2, 2, 37, 37, 24, dtype=torch.bfloat16), 0.3, causal)
    prog = run_and_compare(fn, inputs, contraction=True, native=False)
    fused = [t for t in prog.lowered.tile.kernels if t.mode == "attention"]
    assert len(fused) == 3 and all(dict(t.knobs)["INSTR"] == "mma" for t in fused)


def test_a_split_of_the_keys_is_refused_in_the_sum_form():
    def fn(g, q, k, v, out, lse):
        return ops.attention_backward(g, q, k, v, None, out, lse, 0.3, False)
    import strata
    with pytest.raises(KnobError, match="KV_SPLITS=2"):
        strata.compile(fn, _backward_inputs(*_qkv(1, 1, 1, 1, 64, 16), 0.3, False),
                       ctx=Context(knobs={"KV_SPLITS": 2}))


@pytest.mark.parametrize("hk,causal", [(4, False), (2, True)])
def test_the_ops_differentiate_as_sdpa_does(hk, causal):
    """The torch bodies (what AOTAutograd traces, and a reference) against SDPA's own autograd."""
    torch.manual_seed(3)
    q, k, v = (t.requires_grad_() for t in _qkv(2, 4, hk, 7, 7, 8, 6, dtype=torch.float64))
    out, _ = ops.attention(q, k, v, None, 0.4, causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.4,
                                                           enable_gqa=hk != 4)
    g = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_mask_is_read_by_every_kernel_and_a_fully_masked_row_gets_zeros(kind):
    """transformers passes its causal mask as a tensor: a boolean (broadcast over heads, one
    query row with no key) or an additive one; dk's and dv's kernels read it transposed."""
    torch.manual_seed(5)
    q, k, v = _qkv(2, 2, 2, 9, 13, 8)
    keep = torch.rand(2, 1, 9, 13) > 0.3
    keep[:, :, 4] = False
    mask = keep if kind == "bool" else torch.where(keep, 0.0, float("-inf")) + 0.1 * torch.randn(2, 1, 9, 13)

    def fwd(q, k, v, mask):
        return ops.attention(q, k, v, mask, 0.3, False)

    def bwd(g, q, k, v, out, lse, mask):
        return ops.attention_backward(g, q, k, v, mask, out, lse, 0.3, False)
    out = check_fused(fwd, (q, k, v, mask)).run_numpy((q, k, v, mask))[0]
    assert (out[:, :, 4] == 0).all()
    prog = run_and_compare(bwd, _backward_inputs(q, k, v, 0.3, False, mask), contraction=True)
    assert len(_attention_kernels(prog)) == 3
