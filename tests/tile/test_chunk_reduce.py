"""chunk_reduce: a long reduction over few rows is split across blocks, and still matches eager."""
import pytest
import torch

from conftest import run_and_compare
from strata.core.context import Context


def _chunked(prog):
    names = [k.name for k in prog.kernels]
    return len(names) == 2 and names[0].endswith("_chunks")


@pytest.mark.parametrize("name,fn,shape", [
    ("sum_1M", lambda x: x.sum(), (1 << 20,)),
    ("mean_rows", lambda x: x.mean(-1), (3, 3 * 8192)),
    ("amax", lambda x: x.amax(-1), (2, 40000)),
    ("prod", lambda x: (1 + x.double() * 1e-3).prod(-1), (1, 8192)),  # (in float32 eager itself is off by up to 1e-5)
    ("var_two_pass", lambda x: x.var(-1), (2, 32768)),
    ("softmax_vocab", lambda x: torch.softmax(x, -1), (1, 32000)),
    ("strided_axis", lambda x: x.sum(0), (65536, 3)),
    ("bf16_logsumexp", lambda x: torch.logsumexp(x, -1), (1, 24576)),
])
def test_split_reductions_match_eager(name, fn, shape):
    dtype = torch.bfloat16 if name.startswith("bf16") else torch.float32
    x = torch.randn(shape).to(dtype)
    prog = run_and_compare(fn, (x,))
    assert _chunked(prog), [k.name for k in prog.kernels]


def test_partials_are_combined_by_the_original_kernel():
    ctx = Context(verbosity=0)
    prog = run_and_compare(lambda x: x.sum(), (torch.randn(1 << 16),), ctx=ctx)
    tile = prog.ir("tile")
    assert "k_sum_1_reduce_chunks  # BLOCK=" in tile and "CHUNKS=16" in tile
    assert "load k_sum_1_reduce_acc0_partial[a0]" in tile
    assert any("split into 16 chunks of 4096" in m for m in ctx.messages)


def test_knob_pins_chunks_and_rejects_a_non_divisor():
    prog = run_and_compare(lambda x: x.sum(-1), (torch.randn(2, 1000),), ctx=Context(knobs={"CHUNKS": "8"}))
    assert "Tile(rows=(a0:2, a1_c:8)" in prog.ir("tile")
    with pytest.raises(ValueError, match="CHUNKS=7: must divide"):
        run_and_compare(lambda x: x.sum(-1), (torch.randn(2, 1000),), ctx=Context(knobs={"CHUNKS": "7"}))


@pytest.mark.parametrize("fn,shape,why", [
    (lambda x: x.argmax(-1), (1, 1 << 16), "argmax/argmin"),
    (lambda x: x.sum(-1), (1, 65537), "no divisor"),
    (lambda x: x.sum(-1), (512, 8192), "rows already fill"),
    (lambda x: x.sum(-1), (1, 2048), "fits one block"),
])
def test_declines_say_why(fn, shape, why):
    ctx = Context()
    prog = run_and_compare(fn, (torch.randn(shape),), ctx=ctx)
    assert not _chunked(prog)
    assert any("chunk_reduce" in m and "declined" in m and why in m for m in ctx.messages), ctx.messages


# ---------------------------------------------------------------- on the CPU: a block is a thread

def test_on_the_cpu_a_whole_tensor_sum_shares_the_cores():
    import strata
    ctx = Context(target="host")
    x = torch.randn(1 << 20)
    prog = strata.compile(lambda t: t.sum(), (x,), device="cpu", ctx=ctx)
    assert _chunked(prog.lowered.kernel), [k.name for k in prog.lowered.kernel.kernels]
    assert any("split into" in m and "chunks of" in m for m in ctx.messages)
    torch.testing.assert_close(prog(x).double(), x.double().sum(), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("shape, why", [
    ((1, 65536), "too short to share"),                 # under two chunks of 2^16
    ((64, 1 << 17), "already fill the cores"),
])
def test_on_the_cpu_small_or_many_reductions_stay_whole(shape, why):
    import strata
    ctx = Context(target="host")
    x = torch.randn(shape)
    prog = strata.compile(lambda t: t.sum(-1), (x,), device="cpu", ctx=ctx)
    assert not _chunked(prog.lowered.kernel)
    torch.testing.assert_close(prog(x), x.sum(-1), rtol=1e-4, atol=1e-3)
    assert any("chunk_reduce" in m and why in m for m in ctx.messages), ctx.messages
