"""Compile the issue's full-size layers to CUDA on this machine: `python -m strata.bench.big_layers`.

Why: a ViT-B/16 encoder layer and a Mixtral-8x7B mixture-of-experts layer must compile in under
a minute each on a CPU machine, and the MoE layer's expert matmuls must read an expert's weights
once per tile of its routed rows, not once per (token, choice) row. The layers are built from
transformers' config classes under fake tensors (shapes only, nothing downloaded or run); the
table gives the wall time of build + compile, the kernel count and, for MoE layers, the tiles of
the expert matmuls: a tile is one block row that reads its expert's weights once (nothing when
the routing leaves it empty), so an expert's weights are read once per tile of its rows.
"""
from __future__ import annotations

import math
import sys
import time

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..api import compile as strata_compile
from ..core.context import Context
from ..loop.ir import Load
from ..tile.ir import walk

TARGET = "sm_90"


def vit_b16_layer():
    import transformers
    cfg = transformers.ViTConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                                 image_size=224, patch_size=16)
    cfg._attn_implementation = "sdpa"
    return transformers.models.vit.modeling_vit.ViTLayer(cfg), (1, 197, 768)


def mixtral_8x7b_moe_block():
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    return MixtralSparseMoeBlock(_mixtral_config()), None


def mixtral_8x7b_layer():
    from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer, MixtralRotaryEmbedding
    cfg = _mixtral_config()
    return _WithRotary(MixtralDecoderLayer(cfg, 0), MixtralRotaryEmbedding(cfg)), None


def _mixtral_config():
    import transformers
    cfg = transformers.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                     num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                                     vocab_size=32000)
    cfg._attn_implementation = "sdpa"
    return cfg


class _WithRotary(torch.nn.Module):
    """A decoder layer called as a model calls it (position embeddings computed in the graph)."""

    def __init__(self, layer, rotary):
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, hidden):
        pos = torch.arange(hidden.shape[1], device=hidden.device)[None]
        out = self.layer(hidden, position_embeddings=self.rotary(hidden, pos), position_ids=pos)
        return out[0] if isinstance(out, tuple) else out


CASES = [("ViT-B/16 encoder layer", vit_b16_layer, 197),
         ("Mixtral-8x7B MoE block", mixtral_8x7b_moe_block, 16),
         ("Mixtral-8x7B MoE block", mixtral_8x7b_moe_block, 1),
         ("Mixtral-8x7B decoder layer", mixtral_8x7b_layer, 128)]


def expert_tiles(prog) -> tuple[int, int] | None:
    """(tiles, rows per tile) of the expert matmuls, from their block tiles: each tile is one
    block row reading one expert's weights (predicated off for a tile the routing leaves empty),
    so an expert's weights are read ceil(its rows / rows per tile) times. None without experts."""
    found = set()
    for k in prog.lowered.tile.kernels:
        loads = [s for s in walk(k.body) if isinstance(s, Load) and "experts" in s.buf]
        if not loads:
            continue
        mm, extents = k.matmul, dict(k.domain)
        if mm is None or not all(s.pred is not None for s in loads):
            raise AssertionError(f"{k.name} is not a predicated tiled contraction")
        split = dict(k.knobs).get("SPLIT_K", 1)     # its K slices each read a part of the slab
        tiles = math.prod(e for v, e in k.domain if v not in (mm.m, mm.n)) // split
        rows = extents[mm.m] if mm.m else 1
        assert not mm.m or mm.tile_m >= rows, f"{k.name}: a tile spans several blocks along M"
        found.add((tiles, rows))
    assert len(found) <= 1, found
    return found.pop() if found else None


def run_case(name, make, tokens) -> dict:
    t0 = time.perf_counter()
    with FakeTensorMode():
        torch.set_default_dtype(torch.bfloat16)
        try:
            module, shape = make()
        finally:
            torch.set_default_dtype(torch.float32)
        x = torch.randn(shape or (1, tokens, 4096), dtype=torch.bfloat16)
    prog = strata_compile(module.eval(), (x,), until="cuda", ctx=Context(target=TARGET))
    seconds = time.perf_counter() - t0
    row = dict(layer=name, tokens=tokens, ops=len(prog.torch_program.nodes),
               kernels=len(prog.lowered.kernel.kernels), seconds=seconds)
    tiles = expert_tiles(prog)
    if tiles:
        row["tiles"] = f"{tiles[0]} x {tiles[1]} rows for {tokens * 2} rows"
    return row


def main() -> int:
    print(f"target {TARGET}, bf16, shapes only; times are build + compile wall seconds", file=sys.stderr)
    print("| layer | tokens | aten ops | kernels | compile | expert tiles (at most) |")
    print("|---|---|---|---|---|---|")
    for name, make, tokens in CASES:
        r = run_case(name, make, tokens)
        print(f"| {r['layer']} | {r['tokens']} | {r['ops']} | {r['kernels']} | {r['seconds']:.1f} s "
              f"| {r.get('tiles', '-')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
