"""What dynamo calls for one graph signature: its Program, the weights it holds kept current, and
dynamo's output structure rebuilt around the Program's outputs (torch.compile's backend,
torch_compile/backend.py; the graph side is frontend/dynamo_graph.py).
"""
from __future__ import annotations

import copy
import weakref

import torch.utils._pytree as pytree
from torch.autograd.graph import increment_version

from ..frontend.dynamo_graph import OutputPlan


class CompiledGraph:
    """One Program and how to rebuild dynamo's output structure around its outputs.

    weights: position -> program weight name of the inputs compiled as weights. They are packed
    once; a call whose weight has another version (an optimizer step, load_state_dict,
    `w.add_(1)` under no_grad) hands it to the program again first, so nothing runs stale. A call
    with other weight tensors altogether (dynamo traces nn.Linear.forward once for every Linear,
    the parameters its inputs: regional compilation of a repeated block) runs a program of their
    own, made once (Program.with_weights: the kernels are not rebuilt), so the modules' calls
    never pack each other's weights. A program keeps the weights it was given alive, so a new
    tensor cannot take an old one's address. (A write through `w.data` bumps no version: as for
    autograd, it is not seen.)

    lifted: tensors of dynamo's graph itself the program updates in place (an optimizer's
    parameters and state, rewrite.lift_attributes), passed after dynamo's inputs at every call; held
    weakly, as dynamo's graph drops them with the optimizer. written: the positions of the inputs
    the program updates in place, whose version counters a call bumps, as an in-place op in eager
    does (so that a graph holding one as a weight packs it again)."""

    SETS = 64          # weight sets kept per graph (the oldest other one is dropped beyond)

    def __init__(self, program, plan, slots, device, weights=None, args=(), lifted=(), written=()):
        self.plan, self.slots, self.device = plan, slots, device
        self.lifted, self.written = [weakref.ref(t) for t in lifted], written
        self.weights = weights if program is not None and weights else {}
        # shared with moved() twins: the program in use, the stamp of the weights it holds, and
        # the programs of the other weight sets met, by their tensors' addresses
        self.state = {"program": program, "stamp": self._stamp(args) if self.weights else None,
                      "others": {}}

    @property
    def program(self):
        return self.state["program"]

    def _stamp(self, args) -> list:
        return [(args[i].data_ptr(), args[i]._version) for i in self.weights]

    def _use_weights(self, args, stamp) -> None:
        st, given = self.state, {name: args[i] for i, name in self.weights.items()}
        program, held = st["program"], st["stamp"]
        if [p for p, _ in stamp] != [p for p, _ in held]:        # other tensors
            others = st["others"]
            others[tuple(p for p, _ in held)] = (program, held)
            program, held = others.pop(tuple(p for p, _ in stamp), (None, stamp))
            program = program or st["program"].with_weights(given)
            while len(others) >= self.SETS:
                others.pop(next(iter(others)))
        if stamp != held:                                        # updated in place since
            program.set_weights({name: given[name] for name, now, then in zip(
                self.weights.values(), stamp, held) if now != then})
        st["program"], st["stamp"] = program, stamp

    def moved(self, old: list[int], new: list[int]) -> CompiledGraph:
        """The same program for another graph (dynamo_key.py), whose k-th tensor input is at
        position new[k] where this graph's is at old[k]."""
        at = dict(zip(old, new))
        twin = copy.copy(self)
        twin.slots = [at[i] for i in self.slots]
        twin.weights = {at[i]: name for i, name in self.weights.items()}
        twin.plan = OutputPlan()
        twin.plan.spec, twin.plan.plain = self.plan.spec, self.plan.plain
        twin.plan.leaves = [(kind, at[v]) if kind == "input" else (kind, v)
                            for kind, v in self.plan.leaves]
        return twin

    def __call__(self, args):
        if self.lifted:
            args = [*args, *(r() for r in self.lifted)]
        if self.weights and (stamp := self._stamp(args)) != self.state["stamp"]:
            self._use_weights(args, stamp)
        tensors = [args[i] for i in self.slots]
        flat = self.program.run_flat(tensors) if self.program is not None else []
        if self.written:
            increment_version([args[i] for i in self.written])
        if self.device == "sim" and tensors and tensors[0].device.type != "cpu":
            flat = [t.to(tensors[0].device) for t in flat]
        if self.plan.plain:                 # dynamo's usual (out, ...): nothing to place
            return tuple(flat)
        leaves = [flat[v] if kind == "out" else args[v] if kind == "input" else v
                  for kind, v in self.plan.leaves]
        return pytree.tree_unflatten(leaves, self.plan.spec)


class BucketProgram:
    """A shape-dynamic graph's program for a bucket of sizes (buckets.py): a call's tensors are
    padded to the bucket's sizes, its sizes passed as values, the outputs narrowed back.
    write_back: (padded graph's input, caller's input) pairs of inputs the program updates in
    place that were padded (a static cache's rows): copied back into the caller's after a call."""

    def __init__(self, plan, compiled: CompiledGraph, caps: tuple[int, ...], device, write_back=()):
        self.plan, self.compiled, self.caps, self.device = plan, compiled, caps, device
        self.write_back = write_back

    @property
    def program(self):
        return self.compiled.program

    def __call__(self, args):
        values = self.plan.values(args)
        inputs = self.plan.inputs(args, values, self.caps, self.device)
        out = self.compiled(inputs)
        for w, i in self.write_back:
            args[i].copy_(inputs[w][tuple(slice(0, n) for n in args[i].shape)])
        leaves, spec = pytree.tree_flatten(out)
        return pytree.tree_unflatten(self.plan.outputs(leaves, args, values), spec)
