"""The modules strata captures for a Hugging Face causal LM.

`CausalLMLogits`: the whole model, `input_ids -> logits`. transformers returns a ModelOutput
with a KV cache object torch.export cannot flatten; the cache is off (`use_cache=False`) and the
program's one output is the logits tensor (batch, seq, vocab), i.e. `model(ids).logits`.

`DecoderLayer`: decoder layer N alone, `hidden_states -> hidden_states`, with what the model
would hand it computed inside the graph: positions 0..S-1, the rotary cos/sin from the model's
own rotary embedding (so Llama-3 rope scaling is whatever the config says), and the additive
causal mask (0 on and below the diagonal, the dtype's minimum above, as transformers builds it).
"""
from __future__ import annotations

import torch
from torch import nn

from . import hf


class CausalLMLogits(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.lm = model

    def forward(self, input_ids, attention_mask=None):
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits


class DecoderLayer(nn.Module):
    def __init__(self, model: nn.Module, index: int):
        super().__init__()
        dec = hf.decoder(model)
        self.layer = dec.layers[index]
        self.rotary_emb = dec.rotary_emb

    def forward(self, hidden_states):
        s = hidden_states.shape[1]
        position_ids = torch.arange(s, device=hidden_states.device).unsqueeze(0)
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        lowest = torch.finfo(hidden_states.dtype).min
        mask = torch.full((s, s), lowest, dtype=hidden_states.dtype, device=hidden_states.device)
        mask = mask.triu(1)[None, None]
        out = self.layer(hidden_states, attention_mask=mask, position_ids=position_ids,
                         position_embeddings=(cos, sin))
        return hf.layer_output(out)
