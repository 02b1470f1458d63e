"""Rewrites of dynamo's FX graph before capture, for an optimizer's step (torch_compile/backend.py).

Why: dynamo hands `torch.compile(opt.step)` a graph whose parameters and state are its own
attributes (get_attr nodes), updated in place, and whose arithmetic is foreach ops over lists of
tensors. strata writes in place only the tensors a program is given, and has rules for aten's
per-tensor ops: so the attributes become inputs, and the foreach ops one op per tensor.
"""
from __future__ import annotations

import operator

import torch


def lift_attributes(gm, attrs: list[str], names: list[str]):
    """`gm` reading those of its attributes `attrs` that get_attr nodes read as inputs after its
    own; their tensors; their names (their get_attr nodes', `exp_avg` for one)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    reads = [n for n in graph.nodes if n.op == "get_attr" and n.target in attrs]
    first = {}
    for n in reads:
        first.setdefault(n.target, n.name)
    more = []
    for name in first.values():
        while name in names or name in more:
            name += "_"
        more.append(name)
    with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
        inputs = {t: graph.placeholder(name) for t, name in zip(first, more)}
    for n in reads:
        n.replace_all_uses_with(inputs[n.target])
        graph.erase_node(n)
    return torch.fx.GraphModule(gm, graph), [getattr(gm, t) for t in first], more


def foreach_per_tensor(gm):
    """`gm` with its foreach ops (`torch._foreach_mul_(xs, 0.9)`: an optimizer's, with foreach
    on, the default for CUDA tensors) written as one op per tensor, an in-place one as a copy_ of
    its result: strata has rules for those. A foreach op with no such op, or whose list result is
    used whole, stays (and is named unsupported)."""
    ops = [n for n in gm.graph.nodes if n.op == "call_function"
           and getattr(n.target, "__name__", "").startswith("_foreach_")]
    if not ops:
        return gm
    graph, env = torch.fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, env))

    def at(a, i):
        return a[i] if isinstance(a, (list, tuple)) else a
    for n in (env[o] for o in ops):
        name = n.target.__name__.removeprefix("_foreach_")
        op, users = getattr(torch, name.rstrip("_"), None), list(n.users)
        if op is None or any(u.target is not operator.getitem for u in users):
            continue
        size = len(next(a for a in n.args if isinstance(a, (list, tuple))))
        outs = []
        with graph.inserting_before(n):
            for i in range(size):
                args, kwargs = [at(a, i) for a in n.args], {k: at(v, i) for k, v in n.kwargs.items()}
                if name.rstrip("_") in ("addcmul", "addcdiv") and len(args) == 4:
                    kwargs["value"] = args.pop()        # positional in the foreach op only
                out = graph.call_function(op, tuple(args), kwargs)
                outs.append(graph.call_method("copy_", (args[0], out)) if name.endswith("_") else out)
                for m in (out, outs[-1]):           # the user's line, as provenance
                    m.meta["stack_trace"] = n.meta.get("stack_trace")
        for u in users:
            u.replace_all_uses_with(outs[u.args[1]])
            graph.erase_node(u)
        graph.erase_node(n)
    return torch.fx.GraphModule(gm, graph)
