"""Capture mixture-of-experts layers in a form torch.export can, as a grouped expert matmul:
used by capture and by the check's shape dry run, which must run the module the way it is
captured."""
from __future__ import annotations

import contextlib

import torch

_notes: list[str] | None = None      # the open static_experts context's notes


def grouping(tokens: int, k: int, experts: int) -> tuple[int, int]:
    """(G, NT): rows per tile and the most tiles any routing of tokens x k rows needs. A tile
    reads its expert's weights once, so G is as large as one block's M tile allows (64), and
    no larger than the most rows an expert can get (one per token); NT bounds the sum over
    experts of ceil(rows / G), each expert's rows at most `tokens`."""
    g = 1
    while g < min(tokens, 64):
        g *= 2
    return g, min((tokens * k + experts * (g - 1)) // g, experts * -(-tokens // g))


def grouped_experts_forward(self, hidden, top_k_index, top_k_weights):
    """transformers' experts forward, static-shaped: the T*K (token, choice) rows are placed
    by expert into NT tiles of G rows (each expert's rows padded to whole tiles, unused rows
    and tiles zero), every tile one batch of a bmm whose weights are its expert's, so a kernel
    reads an expert's weights once per tile of its rows, not once per row."""
    tokens, k = top_k_index.shape
    experts, width, rows = self.num_experts, hidden.shape[-1], top_k_index.numel()
    g, nt = grouping(tokens, k, experts)
    if _notes is not None and not _notes:
        _notes.append(f"mixture-of-experts layers exported as a grouped expert matmul: the "
                      f"{rows} (token, choice) rows placed by expert into {nt} tiles of {g} rows, "
                      f"one expert per tile (static shapes; transformers' eager and grouped_mm "
                      f"forms have data-dependent ones)")
    ids = top_k_index.reshape(-1)
    onehot = (ids[:, None] == torch.arange(experts, device=ids.device)).to(torch.int64)
    rank = ((onehot.cumsum(0) - 1) * onehot).sum(1)              # place among its expert's rows
    tiles = (onehot.sum(0) + g - 1) // g
    tile_end = tiles.cumsum(0)
    dest = (tile_end - tiles)[ids] * g + rank                    # each row's padded position
    src = torch.full((nt * g,), rows, dtype=torch.int64, device=ids.device)
    src[dest] = torch.arange(rows, device=ids.device)            # each position's row (or none)
    tile = torch.arange(nt, device=ids.device)
    expert = (tile[:, None] >= tile_end).sum(1).clamp(max=experts - 1)
    used = (tile < tile_end[-1])[:, None, None]        # a tile the routing leaves empty reads no weights
    x = hidden[(src // k).clamp(max=tokens - 1)] * (src < rows)[:, None].to(hidden.dtype)
    up = "gate_up_proj" if self.has_gate else "up_proj"
    y = _tile_linear(self, x.view(nt, g, width), up, expert, used)
    y = self._apply_gate(y) if self.has_gate else self.act_fn(y)
    z = _tile_linear(self, y, "down_proj", expert, used)
    if self.has_post_expert_norm:
        z = self.post_expert_norm(z)
    z = z.reshape(nt * g, width)
    # back to row order by a scatter (unused positions to spare rows of their own, so no two
    # write one row): a gather z[dest] would be fused into its consumer, computing each row's
    # down projection apart again
    spare = rows + torch.arange(nt * g, device=ids.device)
    out = torch.zeros(rows + nt * g, width, dtype=z.dtype, device=z.device)
    out[torch.where(src < rows, src, spare)] = z
    return (out[:rows] * top_k_weights.reshape(-1, 1)).view(tokens, k, width).sum(1).to(hidden.dtype)


def _tile_linear(self, x, name: str, expert, used):
    """x [tiles, rows, in] times each tile's expert's weight `name` (and its bias); zero weights
    for an unused tile (strata reads a gather under a where only where it is taken)."""
    w = torch.where(used, getattr(self, name)[expert], 0)
    y = torch.bmm(x, w if self.is_transposed else w.transpose(1, 2))
    return y + getattr(self, name + "_bias")[expert][:, None, :] if self.has_bias else y


@contextlib.contextmanager
def static_experts(module):
    """Export mixture-of-experts layers with grouped_experts_forward (restored afterwards)."""
    global _notes
    experts = [m for m in (module.modules() if hasattr(module, "modules") else ())
               if type(m).__name__.endswith("Experts") and getattr(m, "config", None) is not None]
    configs = {id(m.config): m.config for m in experts}
    _notes = notes = []
    if configs:
        from transformers.integrations.moe import ExpertsInterface
        ExpertsInterface.register("strata_grouped", grouped_experts_forward)
    before = {key: c._experts_implementation for key, c in configs.items()}
    for c in configs.values():
        c._experts_implementation = "strata_grouped"
    try:
        yield notes
    finally:
        _notes = None
        for key, c in configs.items():
            c._experts_implementation = before[key]
