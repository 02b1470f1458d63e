"""Fusion decisions: what becomes one kernel, what is refused and why (logged at -v)."""
import numpy as np
import torch

import strata
from conftest import run_and_compare
from strata.core.context import Context
from strata.loop import eval as loop_eval


def _loop(fn, *inputs, ctx=None):
    ctx = ctx or Context()
    return strata.compile(fn, inputs, ctx=ctx, until="loop"), ctx


def test_rms_norm_reads_like_the_seed():
    prog, _ = _loop(torch.nn.RMSNorm(2048), torch.randn(1, 32, 2048))
    text = prog.ir("loop")
    assert text.splitlines()[0] == "=== k_rms_norm_reduce -> rms_norm ==="
    assert "for a0 in 0..32:  # free" in text
    assert "    for a1 in 0..2048:  # reduce" in text
    assert "acc0 <- add(acc0, v0)" in text
    assert "rms_norm[0, a0, a2] = " in text


def test_matmul_prologue_and_epilogue_fuse_into_one_nest():
    prog, _ = _loop(lambda x, b, w: torch.relu(torch.matmul(x + b, w)),
                    torch.randn(16, 64), torch.randn(64), torch.randn(64, 16))
    assert len(prog.lowered.loop.kernels) == 1
    text = prog.ir("loop")
    assert "for a2 in 0..64:  # reduce" in text and "relu(acc0)" in text


def test_blow_up_guard_refuses_and_logs_reason():
    ctx = Context(verbosity=0)
    # the column mean would be recomputed for every row: it must get its own kernel
    prog, ctx = _loop(lambda x: x - x.mean(0) - x.mean(1, keepdim=True), torch.randn(6, 9), ctx=ctx)
    assert len(prog.lowered.loop.kernels) >= 2
    assert any("refused fusing" in m and "recomputed" in m for m in ctx.messages)


def test_a_reduction_read_at_several_indices_is_computed_once():
    """RoPE's rotate_half reads the projection at d and d +- half: inlined, the K loop would run
    three times per output; it is stored once and read back instead."""
    def rope_proj(x, w, cos, sin):
        q = x @ w.t()
        return q * cos + torch.cat((-q[..., 16:], q[..., :16]), -1) * sin
    r = torch.randn
    inputs = (r(7, 40), r(32, 40), r(7, 32), r(7, 32))
    prog, ctx = _loop(rope_proj, *inputs)
    assert [k.name for k in prog.lowered.loop.kernels] == ["k_matmul_red_reduce", "k_add"]
    assert any(m.startswith("fuse: refused fusing matmul_red") for m in ctx.messages)
    run_and_compare(rope_proj, inputs, contraction=True)


def test_a_reduction_filling_one_piece_of_a_cat_is_stored_apart():
    """The dynamic KV cache's step: cat(past, v_proj(x)) along the sequence. Inlined into the cat
    the projection's K loop would run at every position of the new cache, not only the last
    (each step 'seq' times its work); it is stored and the cat copies it."""
    def grow(past, x, w):
        return torch.cat((past, (x @ w.t()).unsqueeze(1)), 1)
    r = torch.randn
    inputs = (r(3, 37, 8), r(3, 40), r(8, 40))
    prog, ctx = _loop(grow, *inputs)
    assert len(prog.lowered.loop.kernels) == 2
    assert any("fills only part of it (a piece of a concatenation" in m for m in ctx.messages)
    run_and_compare(grow, inputs, contraction=True)


def test_nested_reduction_over_reduce_axis_is_refused():
    ctx = Context()
    prog, ctx = _loop(lambda x: (x - x.mean(0)).sum(1), torch.randn(5, 7), ctx=ctx)
    assert any("refused fusing" in m for m in ctx.messages)
    x = np.random.randn(5, 7)
    out = loop_eval.run(prog.lowered.loop, {prog.lowered.loop.buffers[0].name: x})
    ref = (x - x.mean(0)).sum(1)
    np.testing.assert_allclose(list(out.values())[0], ref, rtol=1e-12)


def test_loop_eval_matches_eager_for_layer_norm():
    ln = torch.nn.LayerNorm(33)
    x = torch.randn(4, 33)
    prog, _ = _loop(ln, x)
    lp = prog.lowered.loop
    (name,) = prog.torch_program.inputs
    inputs = {name: x.numpy()}
    inputs.update({k: v.numpy() for k, v in prog.torch_program.weights.items()})
    out = list(loop_eval.run(lp, inputs).values())[0]
    ref = ln.double()(x.double()).detach().numpy()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-12


def test_equal_programs_print_identically():
    a, _ = _loop(lambda x: torch.softmax(x, -1), torch.randn(3, 10))
    b, _ = _loop(lambda x: torch.softmax(x, -1), torch.randn(3, 10))
    assert a.ir("loop") == b.ir("loop")


def test_a_contraction_of_a_where_with_a_constant_branch():
    """The attention matcher walks through wheres toward a softmax; where(c, w, 0) has a
    constant branch, which used to crash it (KeyError: 0.0) for every GPU target."""
    def fn(x, w, keep):
        return torch.bmm(x, torch.where(keep[:, None, None], w, 0).transpose(1, 2))
    args = (torch.randn(3, 16, 32), torch.randn(3, 24, 32), torch.tensor([True, False, True]))
    run_and_compare(fn, args)


def test_a_gather_under_a_where_is_read_only_where_it_is_taken():
    """where(keep, table[idx], 0) loads table[idx] only where keep holds (loop/lower.py): the
    simulator, which refuses an out-of-bounds load, runs it with indices out of range exactly
    where keep is false (a mixture-of-experts tile left empty reads no weights this way)."""
    def fn(table, idx, keep):
        return torch.where(keep[:, None], table[idx], 0)
    table, keep = torch.randn(10, 4), torch.tensor([True, False, True, False])
    prog = strata.compile(fn, (table, torch.tensor([1, 2, 3, 4]), keep))
    from strata.tile.ir import walk
    loads = [s for k in prog.lowered.loop.kernels for s in walk(k.body) if getattr(s, "buf", "") == "table"]
    assert loads and all(s.pred is not None for s in loads)
    idx = torch.tensor([1, 12, 3, 99])
    got = prog(table, idx, keep)
    torch.testing.assert_close(got, fn(table, idx.clamp(max=9), keep))
