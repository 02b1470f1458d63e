"""The tuner's measuring process: compiles a program's schedule candidates, checks each against
eager, and times it against the default schedule.

Why a process of its own: a candidate whose kernel crashes or never returns takes this process
with it, not the tuner, which kills and restarts it (search.py). It reads one JSON request per
line on stdin and answers one JSON line on stdout (logs go to stderr):

  {"op": "prepare", "code": CODE | "model": M, "layer": N, "seq_len": S, "dtype": D,
   "max_len": L?, "decode": true? | "case": SUITE CASE, "device": "cpu", "knobs": {pins},
   "cost": "mca"?}   (max_len: generate's prefill, or with decode its step, on an L cache)
      -> {"kernels": [{"name", "signature", "label", "knobs": {NAME: value}, "ms"?}],
          "target": key}   (ms: on the CPU, the default schedule's time of the kernel alone)
  {"op": "estimate", "candidates": [{signature: {NAME: value}}, ...], "seconds": S?}
      -> {"ms": [the cost model's time of the program with each (of the signature's first
          kernel on the CPU), tune/cost.py; with "cost": "mca" each candidate is compiled and
          its hot loops priced by llvm-mca]}
         (the first candidates only, when estimating them took S seconds: a kernel's budget must
         not go to ranking what it cannot time)
  {"op": "build", "kernel_knobs": [{signature: {NAME: value}}, ...]}
      -> {"built": N}  (the next candidates' units compiled at once, a compiler per core: `try`
         finds them in the cache; prepare's "builds" says a worker takes this)
  {"op": "rank", ... as prepare, "target": NAME}
      -> {"kernels": [{... as prepare, "ranked": [[{NAME: value}, modelled ms], ...]}], "target"}
         (llvm-mca's model for that CPU, fastest first; compiled only, so any CPU will do)
  {"op": "try", "kernel_knobs": {signature: {NAME: value}}, "rounds": R, "scope": "program"?}
      -> {"ms": candidate, "default_ms": default, "same": bool, "scope": "kernel" | "program"}
         (interleaved medians; with one signature on the CPU, the candidate is compiled alone
         (units.py) and its kernels' launches timed against the default's, unless scope
         "program" asks for the whole program, compiled and checked against eager)
      or {"error": "wrong" | "does not fit" | "bug", "why": one sentence}
"""
from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time

import torch

from ..api import Program, compile as strata_compile, on_device
from ..bench.cases import cases
from ..bench.check import eager_error, expect, verify
from ..bench.cpu_bench import interleaved_samples
from ..codegen.c import runs_in_parallel
from ..core.context import Context
from ..core.errors import StrataError
from ..frontend.snippet import parse_snippet
from ..loop.ir import signature
from ..models.build import build
from ..models.decode import tuning_prefill, tuning_step
from ..pipeline import lower_torch_program
from ..runtime import native_build
from ..runtime.native import NativeProgram
from ..runtime.threads import THREADS, from_environment, set_threads
from .cost import program_ms
from .search import candidates
from .units import carve, check_unit, load_unit, lower_unit, operands, unit_calls


LOSER = 1.5         # a candidate this much slower than the default in a first round is not
                    # timed again: the budget goes to those that may win
UNIT_KERNELS = 4    # a candidate's unit holds the first few kernels of its signature (a 22-layer
                    # model's repeats cost 5x the time to build and time, and say the same)


def _label(kernel, loop_program) -> str:
    """What a kernel computes, for the report: the buffers it writes and their shapes."""
    shapes = {b.name: b.shape for b in loop_program.buffers}
    return ", ".join(f"{w}{list(shapes[w])}" for w in kernel.writes)


class Worker:
    def __init__(self):
        self.device, self.pins, self.names = "cpu", {}, {}     # names: signature -> loop kernels
        self.static = False             # the cost model prices hot loops with llvm-mca
        self.target = None              # a CPU target to rank for (None: this machine's)
        self.module = self.inputs = self.default = self.expected = self.floor = None
        self.units = {}                 # signature -> units.py's unit of its kernels, or None
        self._last_default = (None, None)       # (signature, its default unit loaded)
        self._built = {}                # (signature, pins) -> a candidate unit lowered by build

    def build(self, req: dict) -> None:
        """The program to tune: a -c snippet, a MODEL (its prefill, one decoder layer's with
        `layer`, or with `decode` its decode step at position seq_len of a max_len cache; weights
        loaded or drawn as `strata compile MODEL` does), or a case of the op suite."""
        if req.get("code"):
            snippet = parse_snippet(req["code"])
            self.module, self.inputs = snippet.module, tuple(snippet.example_inputs)
        elif req.get("model"):
            built = build(req["model"], layer=req.get("layer"), seq_len=req.get("seq_len", 128),
                          dtype=req.get("dtype"), materialise=True)
            self.module, self.inputs = built.module, tuple(built.example_inputs)
            if req.get("max_len"):              # the programs `strata generate` compiles
                how = tuning_step if req.get("decode") else tuning_prefill
                self.module, self.inputs = how(built.model, req["seq_len"], req["max_len"])
        else:
            case = next(c for c in cases() if c.name == req["case"])
            self.module, self.inputs = case.build("cpu")

    def compile(self, kernel_knobs: dict):
        """The program with these per-kernel knobs; the first call captures, later ones reuse
        the captured Torch IR (only the schedule changes between candidates)."""
        ctx = self._context(kernel_knobs)
        if self.default is None:
            return strata_compile(self.module, self.inputs, device=self.device, ctx=ctx)
        ctx = on_device(ctx, self.device)
        program = Program(lower_torch_program(self.default.torch_program, ctx,
                                              ctx.arch.language), self.device)
        program.constants = self.default.constants
        program.load()
        return program

    def check(self, program) -> str | None:
        """None when the program matches eager (outputs poisoned first, so an element no kernel
        writes shows), else the first mismatch."""
        runtime = program.runtime
        runtime.poison = True
        try:
            report = verify(program, self.module, [x.clone() for x in self.inputs],
                            expected=self.expected, floor=self.floor)
        finally:
            runtime.poison = False
        if report.passed:
            return None
        bad = next(r for r in report.outputs if not r.passed)
        return bad.problem or f"{bad.name}: rel err {bad.rel:.3g} (tolerance {bad.tol})"

    def prepare(self, req: dict) -> dict:
        self.device, self.pins = req.get("device", "cpu"), req.get("knobs", {})
        self.static = req.get("cost") == "mca"
        self.build(req)
        if isinstance(self.module, torch.nn.Module):      # tuned for inference
            self.module.requires_grad_(False)
        self.expected = expect(self.module, self.inputs)        # eager's, once per program
        # a schedule is as right as eager in the program's own dtypes, with a margin of 2
        self.floor = [2 * e for e in eager_error(self.module, self.expected)]
        self.default = self.compile({})
        problem = self.check(self.default)
        if problem:
            return {"error": "wrong", "why": f"the default schedule does not match eager: {problem}"}
        lowered = self.default.lowered
        kernels = self._kernels()
        if self.device == "cpu":          # a signature's kernels (a model's layers) timed once
            ms = {}
            for sig in dict.fromkeys(k["signature"] for k in kernels):
                calls = self.kernel_calls(self.default, set(self.names[sig]))
                if calls is not None:
                    ms[sig] = statistics.median(interleaved_samples({"k": calls}, (), 5)["k"])
            for k in kernels:
                if k["signature"] in ms:
                    k["ms"] = ms[k["signature"]]
        return {"kernels": kernels, "target": lowered.target.key, "cores": lowered.target.cores,
                "builds": self.device == "cpu"}

    def _kernels(self) -> list[dict]:
        """The default program's loop kernels: name, signature, label and schedule knobs."""
        lowered = self.default.lowered
        buffers = {b.name: b for b in lowered.loop.buffers}
        teams: dict[str, set] = {}      # the threads each loop kernel's default runs on
        for kk in lowered.kernel.kernels if not lowered.target.is_gpu else ():
            team = (kk.threads or lowered.target.cores) if runs_in_parallel(kk) else 1
            teams.setdefault(lowered.tile.origin.get(kk.name, kk.name), set()).add(team)
        kernels = []
        for k in lowered.loop.kernels:
            knobs: dict = {}
            for t in lowered.tile.kernels:
                if lowered.tile.origin.get(t.name) == k.name:
                    knobs.update(t.knobs)
            kernels.append({"name": k.name, "signature": signature(k, buffers),
                            "label": _label(k, lowered.loop), "knobs": knobs,
                            "stores": len(k.stores),
                            "team": next(iter(teams[k.name])) if len(teams.get(k.name, ())) == 1
                            else 0})
            self.names.setdefault(kernels[-1]["signature"], []).append(k.name)
        return kernels

    def rank(self, req: dict) -> dict:
        """Every candidate of every kernel ranked by llvm-mca's model for `req["target"]`, a CPU
        this machine need not have: compiled, never run (no check, no timing)."""
        self.pins, self.static, self.target = req.get("knobs", {}), True, req["target"]
        self.build(req)
        self.default = strata_compile(self.module, self.inputs, device="cpu", until="c",
                                      ctx=self._context({}))
        kernels = [k for k in self._kernels() if k["knobs"]]
        low = self.default.lowered
        default_ms = program_ms(low.kernel.kernels, low.target, low.source)   # unpriced: one sentence
        for k in kernels:
            k["ranked"], k["unpriced"] = [[{}, default_ms]], 0
            for pins in candidates(k["knobs"], low.target.cores, k["stores"], k["team"]):
                cand = self._lowered({k["signature"]: pins})
                if cand is None or cand.source == low.source:
                    continue                    # does not fit, or the same program
                try:
                    k["ranked"].append([pins, program_ms(cand.kernel.kernels, cand.target, cand.source)])
                except StrataError:
                    k["unpriced"] += 1
            k["ranked"].sort(key=lambda pm: pm[1])
        return {"kernels": kernels, "target": self.default.lowered.target.key}

    def _context(self, kernel_knobs: dict) -> Context:
        return Context(knobs=dict(self.pins), tuned=False, kernel_knobs=kernel_knobs,
                       target=self.target)

    def _cpu_context(self, kernel_knobs: dict) -> Context:
        return on_device(self._context(kernel_knobs), "cpu")

    def time(self, programs: dict, rounds: int) -> dict:
        args = [x.clone() for x in self.inputs]
        samples = interleaved_samples(programs, args, rounds)
        return {name: statistics.median(ts) for name, ts in samples.items()}

    def estimates(self, candidates: list[dict], seconds: float | None) -> list[float]:
        """estimate() of each candidate in turn, until `seconds` have gone by."""
        stop = time.monotonic() + (float("inf") if seconds is None else seconds)
        out = []
        for kernel_knobs in candidates:
            if out and time.monotonic() > stop:
                break
            out.append(self.estimate(kernel_knobs))
        return out

    def estimate(self, kernel_knobs: dict) -> float:
        """The cost model's time of the program with these knobs (lowered, not compiled);
        infinite for knobs that do not fit the kernel (ranked last, and refused when tried).
        With one signature's knobs, of one of its kernels alone (units.carve): the others are
        the same whatever the knobs, and lowering the whole program took 6 s on TinyLlama."""
        lowered = self._lowered_alone(kernel_knobs)
        try:
            return program_ms(lowered.kernel.kernels, lowered.target,
                              lowered.source if self.static else None) if lowered else float("inf")
        except StrataError:             # llvm-mca cannot price it
            return float("inf")

    def _lowered_alone(self, kernel_knobs: dict):
        """_lowered, or with one signature's knobs on the CPU, its first kernel alone."""
        (sig, *more), loop = kernel_knobs, self.default.lowered.loop
        one = self.names.get(sig, [])[:1]
        unit = carve(loop, set(one)) if self.device == "cpu" and not more and one \
            and not _structural(kernel_knobs) else None
        if unit is None:
            return self._lowered(kernel_knobs)
        try:
            return lower_unit(unit, self._cpu_context(kernel_knobs), loop, self.static)
        except StrataError:
            return None

    def _lowered(self, kernel_knobs: dict):
        """The default's Torch IR lowered with these knobs (to C for llvm-mca's model), or None
        when they do not fit."""
        ctx = on_device(self._context(kernel_knobs), self.device)
        try:
            return lower_torch_program(self.default.torch_program, ctx,
                                       ctx.arch.language if self.static else "kernel")
        except StrataError:
            return None

    def try_(self, req: dict) -> dict:
        (sig, *more) = req["kernel_knobs"]
        structural = _structural(req["kernel_knobs"])
        if self.device == "cpu" and not more and req.get("scope") != "program" \
                and not structural and self._unit(sig) is not None:
            return self.try_unit(sig, req["kernel_knobs"][sig], req.get("rounds", 7))
        try:
            program = self.compile(req["kernel_knobs"])
        except StrataError as e:
            return {"error": "does not fit", "why": str(e)}
        if _source(program) == _source(self.default):
            return {"same": True}
        problem = self.check(program)
        if problem:
            return {"error": "wrong", "why": problem}
        rounds = req.get("rounds", 7)
        mine, theirs = _changed(program.lowered.loop, self.default.lowered.loop) if structural \
            else (set(self.names.get(sig, [])),) * 2
        runs = {"default": self.kernel_calls(self.default, theirs),
                "candidate": self.kernel_calls(program, mine)} \
            if self.device == "cpu" and not more and req.get("scope") != "program" else {}
        if all(runs.values()) and runs:
            ms = {name: statistics.median(ts) for name, ts in
                  interleaved_samples(runs, (), rounds).items()}
            return {"ms": ms["candidate"], "default_ms": ms["default"], "same": False,
                    "scope": "kernel"}
        ms = self.time({"default": self.default, "candidate": program}, rounds)
        return {"ms": ms["candidate"], "default_ms": ms["default"], "same": False,
                "scope": "program"}

    def _unit(self, sig: str):
        """(unit's Loop IR, its operands, its default C) of signature `sig`, made once; None
        when its kernels cannot stand alone (units.carve)."""
        if sig not in self.units:
            whole = self.default.lowered.loop
            unit = carve(whole, set(self.names.get(sig, [])[:UNIT_KERNELS]))
            self.units[sig] = unit and (
                unit, operands(self.default, unit, [x.clone() for x in self.inputs]),
                lower_unit(unit, self._cpu_context({}), whole).source)
        return self.units[sig]

    def build_units(self, kernel_knobs: list[dict]) -> int:
        """Lower the units of these candidates (one signature each) and compile them at once, a
        C compiler per candidate on the cores there are (the cache keeps their libraries for
        `try`); how many were compiled. One that does not fit is left for `try` to say so."""
        sources = []
        for (sig, pins), in (c.items() for c in kernel_knobs):
            if _structural({sig: pins}) or self._unit(sig) is None:
                continue
            try:
                lowered = lower_unit(self.units[sig][0], self._cpu_context({sig: pins}),
                                     self.default.lowered.loop)
            except StrataError:
                continue
            self._built[_key(sig, pins)] = lowered
            if lowered.source != self.units[sig][2]:
                native_build.build_soon(lowered.source)
                sources.append(lowered.source)
        for source in sources:
            native_build.build_library(source)
        return len(sources)

    def _default_unit(self, sig: str) -> NativeProgram:
        """The default schedule of `sig`'s unit, loaded: what its candidates are timed against,
        built and loaded as they are (the program's own kernels ran ~10% slower than the same
        code as a unit, on panels packed long before). Only the last signature's is kept."""
        if self._last_default[0] != sig:
            unit, _, _ = self._unit(sig)
            lowered = lower_unit(unit, self._cpu_context({}), self.default.lowered.loop)
            self._last_default = (sig, load_unit(lowered, self.default.runtime.weights))
        return self._last_default[1]

    def try_unit(self, sig: str, pins: dict, rounds: int) -> dict:
        """A candidate for one signature's kernels compiled as a unit of their own (units.py):
        checked against and timed with the default schedule's unit, the times scaled to all of
        the signature's kernels."""
        unit, ops, default_source = self._unit(sig)
        try:
            lowered = self._built.pop(_key(sig, pins), None) or \
                lower_unit(unit, self._cpu_context({sig: pins}), self.default.lowered.loop)
        except StrataError as e:
            return {"error": "does not fit", "why": str(e)}
        if lowered.source == default_source:
            return {"same": True}
        native = load_unit(lowered, self.default.runtime.weights)
        problem = check_unit(native, self._default_unit(sig), ops)
        if problem:
            return {"error": "wrong", "why": problem}
        runs = {"default": unit_calls(self._default_unit(sig), ops),
                "candidate": unit_calls(native, ops)}
        ms = {name: ts[0] for name, ts in interleaved_samples(runs, (), 1).items()}
        if ms["candidate"] < LOSER * ms["default"]:     # else a round says enough: it lost
            ms = {name: statistics.median(ts)
                  for name, ts in interleaved_samples(runs, (), rounds).items()}
        scale = len(self.names[sig]) / len(unit.kernels)        # as if all of them ran
        return {"ms": ms["candidate"] * scale, "default_ms": ms["default"] * scale, "same": False,
                "scope": "kernel"}

    def kernel_calls(self, program, loops: set[str]):
        """A function running, alone and in launch order, the kernels of `program` that come
        from the loop kernels `loops` (a split one is several); None if none do.
        Not those the program ran at load (a weight packed into its panel): a call does not."""
        lowered = program.lowered
        run = program.runtime.kernel_runner([x.clone() for x in self.inputs])
        picks = [i for i, k in enumerate(lowered.kernel.kernels)
                 if lowered.tile.origin.get(k.name, k.name) in loops and i not in run.once]
        if not picks:
            return None

        def calls():
            for i in picks:
                run(i)
        return calls


def _structural(kernel_knobs: dict) -> bool:
    """Whether the candidate changes the fusion plan (STORE): its kernels are not those of a
    unit of the default's, so it is compiled whole and its changed kernels timed."""
    return any("STORE" in pins for pins in kernel_knobs.values())


def _changed(loop, default) -> tuple[set[str], set[str]]:
    """(the loop kernels of `loop` that `default` has not, those of `default` that `loop` has
    not): what a STORE decision changed, timed against what it replaced."""
    mine, theirs = set(loop.kernels), set(default.kernels)
    return {k.name for k in loop.kernels if k not in theirs}, \
        {k.name for k in default.kernels if k not in mine}


def _key(sig: str, pins: dict) -> str:
    return sig + json.dumps(pins, sort_keys=True)


def _source(program) -> str:
    lowered = program.lowered
    return hashlib.sha256(lowered.source.encode()).hexdigest()


def main() -> None:
    if from_environment() is None:      # what the database keeps is timed on every core, not on
        set_threads(THREADS.cores)      # those a passing load left (runtime/threads.py)
    worker = Worker()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "rank":
                reply = worker.rank(req)
            elif req["op"] == "build":
                reply = {"built": worker.build_units(req["kernel_knobs"])}
            elif req["op"] == "estimate":
                reply = {"ms": worker.estimates(req["candidates"], req.get("seconds"))}
            else:
                reply = worker.prepare(req) if req["op"] == "prepare" else worker.try_(req)
        except Exception as e:          # noqa: BLE001 - every failure is the candidate's verdict
            reply = {"error": "bug", "why": str(e) if isinstance(e, StrataError)
                     else f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
