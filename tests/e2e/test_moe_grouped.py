"""Mixture-of-experts layers are captured as a grouped expert matmul (frontend/static_experts.py):
the same result as transformers' eager experts for any routing, and kernels that read an
expert's weights once per tile of its rows instead of once per (token, choice) row."""
import pytest
import torch

pytest.importorskip("transformers")

from conftest import run_and_compare  # noqa: E402

import strata  # noqa: E402
from strata.frontend.static_experts import grouping, static_experts  # noqa: E402
from strata.core.expr import free_vars  # noqa: E402
from strata.loop.ir import Let, Load  # noqa: E402
from strata.tile.contraction import uses  # noqa: E402
from strata.tile.ir import walk  # noqa: E402

HIDDEN = 16


def moe_block(arch: str, experts: int = 4, k: int = 2, skew: bool = False, seed: int = 0):
    """A tiny sparse-MoE block of `arch` (float32, random weights); skew: a router that sends
    every token to experts 0 .. k-1 (the most rows one expert can get)."""
    import transformers
    torch.manual_seed(seed)
    if arch == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
        cfg = transformers.MixtralConfig(hidden_size=HIDDEN, intermediate_size=24,
                                         num_local_experts=experts, num_experts_per_tok=k)
    elif arch == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block
        cfg = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=24,
                                          num_experts=experts, num_experts_per_tok=k, norm_topk_prob=True)
    else:
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP as Block
        cfg = transformers.GptOssConfig(hidden_size=HIDDEN, intermediate_size=24,
                                        num_local_experts=experts, num_experts_per_tok=k)
    cfg._experts_implementation = "eager"
    block = Block(cfg).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    if skew:
        router = next(m for n, m in block.named_modules() if n.endswith(("gate", "router")))
        with torch.no_grad():
            router.weight.fill_(-1.0)
            router.weight[:k] = torch.linspace(2.0, 1.0, k)[:, None]   # x > 0: experts 0..k-1
    return block


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("tokens", [1, 5, 37, 70])
@pytest.mark.parametrize("skew", [False, True])
def test_grouped_form_equals_transformers_experts(arch, tokens, skew):
    block = moe_block(arch, skew=skew).double()
    x = torch.rand(1, tokens, HIDDEN, dtype=torch.float64) + (0.1 if skew else -0.5)
    with torch.no_grad():
        want = block(x)
        with static_experts(block) as notes:
            got = block(x)
    want = want[0] if isinstance(want, tuple) else want
    got = got[0] if isinstance(got, tuple) else got
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert "tiles of" in notes[0]


@pytest.mark.parametrize("tokens", [1, 13, 70])
@pytest.mark.parametrize("skew", [False, True])
def test_compiled_moe_block_matches_eager(tokens, skew):
    block = moe_block("mixtral", skew=skew)
    x = torch.rand(1, tokens, HIDDEN) + (0.1 if skew else -0.5)
    run_and_compare(block, (x,))


@pytest.mark.parametrize("device", ["sim", "cpu"])
def test_each_expert_matmul_is_a_block_tiled_contraction_over_one_expert(device):
    """Both expert matmuls take the contraction schedule with the tile's rows as M and the
    tiles as the batch, and their weight loads' expert coordinate depends on the tile only: a
    block reads its expert's weight tile once for all the rows of the tile, and not at all for a
    tile the routing leaves empty. (Captured as transformers' batched_mm, the expert depended on
    the row: one weight read per row.)"""
    tokens, experts, k = 64, 4, 2
    block = moe_block("mixtral", experts=experts, k=k)
    prog = strata.compile(block, (torch.randn(1, tokens, HIDDEN),), device=device)
    g, tiles = grouping(tokens, k, experts)
    weights = {"p_experts_gate_up_proj", "p_experts_down_proj"}
    seen = set()
    for kern in prog.lowered.tile.kernels:
        loads = [s for s in walk(kern.body) if isinstance(s, Load) and s.buf in weights]
        if not loads:
            continue
        assert kern.matmul is not None, f"{kern.name} is not scheduled as a contraction"
        m, n = kern.matmul.m, kern.matmul.n
        assert m is not None, f"{kern.name} multiplies each row by its own weights"
        extents = dict(kern.domain)
        assert extents[m] == g and [e for v, e in kern.domain if v not in (m, n)] == [tiles]
        for load in loads:
            seen.add(load.buf)
            assert m not in _axes(kern, load.index[0]), f"{kern.name} reads {load.buf} per row"
            # read only by a tile the routing uses: an empty one reads no weights
            assert load.pred is not None and _axes(kern, load.pred) <= set(dict(kern.domain)) - {m, n}
    assert seen == weights
    assert tiles < tokens * k          # one weight read per tile, where there was one per row


def _axes(kern, expr) -> set[str]:
    """The domain axes an expression depends on, through the Lets and Loads it reads."""
    defs = {s.var: s for s in walk(kern.body) if isinstance(s, (Load, Let))}
    axes, todo, seen = set(), list(free_vars(expr)), set()
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            axes |= {v} & set(dict(kern.domain))
            todo += list(uses(defs[v])) if v in defs else []
    return axes
