"""A dynamo FX graph as a module strata can capture (torch.compile's backend, dynamo_backend.py):
its non-tensor inputs fixed, its placeholders named readably, its output structure recorded and
rebuilt around a Program's outputs.

Why re-export: dynamo's graph holds torch-level calls (torch.relu, F.linear) with every parameter
and buffer lifted to a graph input. Exporting that GraphModule with torch.export (capture.py,
strata's decomposition table) gives exactly the aten graph `strata.compile` sees, with the user's
source lines kept as provenance.
"""
from __future__ import annotations

import re

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch import nn
from torch.export.graph_signature import InputKind, OutputKind

from ..errors import StrataError


def concrete(a):
    """A concrete example value: dynamo passes a SymInt (with its example value as hint) for a
    size input of a shape-dynamic graph; the call-time value is a plain int."""
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        if a.node.hint is None:
            raise StrataError(f"strata needs concrete sizes; graph input {a} has no example value")
        return a.node.hint
    return a


def count_ops(gm) -> int:
    return sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)


def args_key(args) -> tuple:
    """What a Program is specialised on: tensor shapes, dtypes, devices; other inputs' values."""
    return tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor)
                 else (type(a).__name__, a) for a in args)


class OutputPlan:
    """Where each leaf of dynamo's output comes from (a plain object: torch.export restores a
    module's attributes and containers after tracing, not the attributes of this)."""
    leaves: list | None = None
    spec = None


class SpecialisedGraph(nn.Module):
    """`gm` with its non-tensor inputs fixed, returning only the tensors it computes; the rest
    of its output (inputs passed through, constants) is recorded in `plan` while it is traced."""

    def __init__(self, gm, args):
        super().__init__()
        self.gm = gm
        self.slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self.fixed = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
        self.plan = OutputPlan()

    def forward(self, *tensors):
        args = dict(self.fixed)
        args.update(zip(self.slots, tensors))
        with fx_traceback.preserve_node_meta():    # keep dynamo's user stack traces as provenance
            out = torch.fx.Interpreter(self.gm).run(*(args[i] for i in range(len(args))))
        leaves, spec = pytree.tree_flatten(out)
        plan, computed = [], []
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                plan.append(("const", leaf))
            elif any(leaf is t for t in tensors):        # an input returned as is: keep the alias
                plan.append(("input", self.slots[next(j for j, t in enumerate(tensors) if leaf is t)]))
            else:
                k = next((j for j, c in enumerate(computed) if c is leaf), None)
                if k is None:
                    computed.append(leaf)
                    k = len(computed) - 1
                plan.append(("out", k))
        self.plan.leaves, self.plan.spec = plan, spec
        return tuple(computed)


class CompiledGraph:
    """One Program and how to rebuild dynamo's output structure around its outputs."""

    def __init__(self, program, plan, slots, device):
        self.program, self.plan, self.slots, self.device = program, plan, slots, device

    def __call__(self, args):
        tensors = [args[i] for i in self.slots]
        flat = self.program.run_flat(tensors) if self.program is not None else []
        where = next((t.device for t in tensors), torch.device("cpu"))
        if self.device == "sim" and where.type != "cpu":
            flat = [t.to(where) for t in flat]
        leaves = [flat[v] if kind == "out" else args[v] if kind == "input" else v
                  for kind, v in self.plan.leaves]
        return pytree.tree_unflatten(leaves, self.plan.spec)


def check_functional(torch_program) -> None:
    """An in-place update of a graph input would be lost: refuse it clearly."""
    sig = torch_program.exported.graph_signature
    users = [s.arg.name for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    names = dict(zip(users, torch_program.input_names))
    mutated = [names.get(s.target, s.target) for s in sig.output_specs
               if s.kind in (OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION)]
    if mutated:
        raise StrataError(f"strata cannot compile this graph: it updates its input"
                          f"{'s' if len(mutated) > 1 else ''} {', '.join(mutated)} in place")


def placeholder_names(gm) -> list[str]:
    """Readable, unique names for dynamo's placeholders: L_self_modules_fc1_parameters_weight_
    -> fc1_weight, L_x_ -> x."""
    out: list[str] = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        name = n.name
        for prefix in ("L_", "l_"):
            name = name.removeprefix(prefix)
        name = name.rstrip("_")
        name = re.sub(r"^(self|s)_(?=(modules|parameters|buffers)_)", "", name)
        name = re.sub(r"(^|_)(modules|parameters|buffers)_", r"\1", name)
        if not name.isidentifier():
            name = f"in{len(out)}"
        base, k = name, 1
        while name in out:
            name, k = f"{base}_{k}", k + 1
        out.append(name)
    return out
