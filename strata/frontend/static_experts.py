"""Capture mixture-of-experts layers in a form torch.export can: used by capture and by the
check's shape dry run, which must run the module the way it is captured."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def static_experts(module):
    """Export mixture-of-experts layers with transformers' `batched_mm` experts: the eager one
    loops over the experts hit and gathers their tokens with torch.where, and grouped_mm sorts
    the tokens by expert into groups whose sizes depend on the routing; torch.export cannot
    capture either with static shapes. batched_mm computes each
    (token, chosen expert) pair with that expert's weights: the same result, static shapes."""
    modules = module.modules() if hasattr(module, "modules") else ()
    configs = {id(c): c for m in modules if type(m).__name__.endswith("Experts")
               for c in [getattr(m, "config", None)]
               if c is not None and getattr(c, "_experts_implementation", None) != "batched_mm"}
    notes = ["mixture-of-experts layers exported with transformers' batched_mm experts (each "
             "token times its top-k experts' weights; the eager and grouped_mm forms have "
             "data-dependent shapes)"] if configs else []
    before = {k: c._experts_implementation for k, c in configs.items()}
    for c in configs.values():
        c._experts_implementation = "batched_mm"
    try:
        yield notes
    finally:
        for k, c in configs.items():
            c._experts_implementation = before[k]
