"""A dynamo FX graph as a module strata can capture (torch.compile's backend, torch_compile/backend.py):
its non-tensor inputs fixed, its placeholders named readably, its output structure recorded (to
be rebuilt around a Program's outputs, torch_compile/programs.py), and the inputs dynamo marked static
(a module's parameters and buffers) made the program's weights.

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
from torch.export.graph_signature import OutputKind

from ..core.errors import StrataError


def concrete(a):
    """A concrete example value: dynamo passes a SymInt (with its example value as hint) for a
    size input of a shape-dynamic graph; the call-time value is a plain int."""
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        if a.node.hint is None:
            raise StrataError(f"strata needs concrete sizes; graph input {a} has no example value")
        return a.node.hint
    return a


def is_dynamic(gm) -> bool:
    """Whether dynamo left a size of `gm` symbolic (a SymInt input, a tensor of symbolic shape);
    also when a placeholder has no example value to tell (a graph not made by dynamo)."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("example_value")
        if v is None or isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and any(
                isinstance(d, torch.SymInt) for d in v.shape):
            return True
    return False


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
    plain = False           # leaves are the program's outputs in order, in a tuple


def weight_positions(gm, args) -> list[int]:
    """The graph inputs dynamo marked static (a module's parameters and buffers: placeholder meta
    tensor_dict["_dynamo_static_input_type"], what Inductor's static_input_indices read), or
    parameters. An inference tensor has no version counter to see an update by: it stays an
    input."""
    marked = [bool(n.meta.get("tensor_dict", {}).get("_dynamo_static_input_type"))
              for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, (m, a) in enumerate(zip(marked, args)) if isinstance(a, torch.Tensor)
            and not a.is_inference() and (m or isinstance(a, nn.Parameter))]


class SpecialisedGraph(nn.Module):
    """`gm` with its non-tensor inputs fixed and its static inputs registered as its parameters
    and buffers (so that capture makes them weights), returning only the tensors it computes; the
    rest of its output (inputs passed through, constants) is recorded in `plan` while traced."""

    def __init__(self, gm, args, names: list[str], inputs: frozenset = frozenset()):
        super().__init__()
        self.gm = gm
        self.weights: dict[int, str] = {}        # position -> the attribute holding it
        for i in weight_positions(gm, args):
            if i in inputs:                      # updated in place by the graph: an input
                continue
            name = names[i]
            while hasattr(self, name):
                name += "_"
            if isinstance(args[i], nn.Parameter):
                self.register_parameter(name, args[i])
            else:
                self.register_buffer(name, args[i])
            self.weights[i] = name
        self.slots = [i for i, a in enumerate(args)
                      if isinstance(a, torch.Tensor) and i not in self.weights]
        self.fixed = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
        self.plan = OutputPlan()

    def forward(self, *tensors):
        args = dict(self.fixed)
        args.update(zip(self.slots, tensors))
        args.update({i: getattr(self, name) for i, name in self.weights.items()})
        with fx_traceback.preserve_node_meta():    # keep dynamo's user stack traces as provenance
            out = torch.fx.Interpreter(self.gm).run(*(args[i] for i in range(len(args))))
        given = {id(t): i for i, t in args.items() if isinstance(t, torch.Tensor)}
        leaves, spec = pytree.tree_flatten(out)
        plan, computed = [], []
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                plan.append(("const", leaf))
            elif id(leaf) in given:             # an input returned as is: keep the alias
                plan.append(("input", given[id(leaf)]))
            else:
                k = next((j for j, c in enumerate(computed) if c is leaf), None)
                if k is None:
                    computed.append(leaf)
                    k = len(computed) - 1
                plan.append(("out", k))
        self.plan.leaves, self.plan.spec = plan, spec
        self.plan.plain = spec.type is tuple and plan == [("out", k) for k in range(len(plan))]
        return tuple(computed)


def mutated_weights(torch_program) -> set[str]:
    """The attributes of a SpecialisedGraph's weights the graph updates in place (a step counter
    kept in a buffer): they must be inputs, written in the caller's tensor, not packed copies."""
    sig = torch_program.exported.graph_signature
    return {s.target for s in sig.output_specs
            if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)}


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
