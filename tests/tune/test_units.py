"""A tuning candidate compiled alone (strata/tune/units.py): the kernels of one signature carved
from the program, run on the operands a whole run gave them, checked against the default's
outputs and timed, without compiling the whole program again."""
import sys
from pathlib import Path

import pytest
import torch

from conftest import HAS_CC
from strata.tune import units
from strata.tune.worker import Worker

native = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot run")
sys.path.insert(0, str(Path(__file__).parents[1] / "models"))

MATMUL = "torch.softmax(torch.randn(64, 512), dim=-1) @ torch.randn(512, 256)"


def _prepared(req: dict) -> tuple[Worker, dict]:
    w = Worker()
    info = w.prepare({"op": "prepare", "device": "cpu", **req})
    assert "error" not in info, info
    return w, info


def _kernel(info, knob: str, label: str = "") -> dict:
    return next(k for k in info["kernels"] if knob in k["knobs"] and label in k["label"])


@native
def test_a_units_default_schedule_gives_the_whole_programs_bits():
    """The operands are taken from a run stepped kernel by kernel, and the unit compiled with the
    default schedule writes what the whole program wrote, bit for bit."""
    w, info = _prepared({"code": MATMUL})
    k = _kernel(info, "THREAD_M")
    unit, ops, source = w._unit(k["signature"])
    assert [b.kind for b in unit.buffers] == ["input", "input", "output"]
    assert list(ops) == ["in1", "softmax"]
    x, m = w.inputs
    torch.testing.assert_close(ops["softmax"], torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-6)
    lowered = units.lower_unit(unit, w._cpu_context({}), w.default.lowered.loop)
    assert lowered.source == source and "k_softmax" not in source
    (out,) = units.load_unit(lowered, w.default.runtime.weights).run(list(ops.values()))
    assert torch.equal(out, w.default(x, m))


@native
def test_a_candidate_is_compiled_alone_checked_and_timed():
    w, info = _prepared({"code": MATMUL})
    k = _kernel(info, "THREAD_M")
    other = 2 if k["knobs"]["THREAD_M"] != 2 else 4
    reply = w.try_({"kernel_knobs": {k["signature"]: {"THREAD_M": other}}, "rounds": 3})
    assert reply["scope"] == "kernel" and 0 < reply["ms"] < float("inf")
    assert w.try_({"kernel_knobs": {k["signature"]: {}}, "rounds": 3}) == {"same": True}
    # compiled ahead, two at once (the default's own code is not compiled again)
    a, b = [n for n in (16, 32, 64) if n != k["knobs"].get("TILE_N")][:2]   # not the default's
    batch = [{k["signature"]: {"TILE_N": a}}, {k["signature"]: {"TILE_N": b}},
             {k["signature"]: {}}]
    assert w.build_units(batch) == 2 and len(w._built) == 3
    assert w.try_({"kernel_knobs": batch[0], "rounds": 3})["scope"] == "kernel"
    assert len(w._built) == 2


@native
def test_a_unit_that_computes_something_else_is_wrong(monkeypatch):
    """The check is against the default's outputs: a unit reading a weight 3% off fails it."""
    from model_helpers import hf_model
    from strata.models.wrappers import CausalLMLogits
    model = hf_model("llama", seed=3)
    w = Worker()
    w.module, w.inputs = CausalLMLogits(model).eval(), (torch.randint(0, 96, (1, 8)),)
    monkeypatch.setattr(w, "build", lambda req: None)
    info = w.prepare({"op": "prepare", "device": "cpu"})
    k = _kernel(info, "TILE_N", "[1, 8, 1, 256]")    # the MLP's gate and up, two layers alike
    unit, ops, _ = w._unit(k["signature"])
    assert len(unit.kernels) == 2 and not any(b.kind == "temp" for b in unit.buffers)
    pins = {"TILE_N": 16 if k["knobs"]["TILE_N"] != 16 else 32}
    good = units.load_unit(units.lower_unit(unit, w._cpu_context({k["signature"]: pins}),
                                            w.default.lowered.loop), w.default.runtime.weights)
    default = w._default_unit(k["signature"])
    assert units.check_unit(good, default, ops) is None
    weights = dict(w.default.runtime.weights)
    name = next(b.name for b in unit.buffers if b.kind == "weight")
    weights[name] = weights[name] * 1.03
    bad = units.load_unit(units.lower_unit(unit, w._cpu_context({}), w.default.lowered.loop),
                          weights)
    assert "against the default schedule's" in units.check_unit(bad, default, ops)


@native
def test_a_unit_writing_part_of_a_buffer_is_compared_where_it_writes():
    """A KV cache's update writes 2 of a buffer's 256 positions (the rest another kernel's):
    candidates were refused as wrong when the unwritten rest, poisoned, was compared with the
    whole program's values (causal attention's query blocks hit it first)."""
    code = ("torch.relu(torch.randn(1, 4, 256, 64)).index_copy_(2, torch.tensor([5, 9]), "
            "torch.randn(1, 4, 2, 64)).sum(-1)")
    w, info = _prepared({"code": code})
    k = next(k for k in info["kernels"] if k["name"] == "k_index_copy")
    unit, _, _ = w._unit(k["signature"])
    assert [b.kind for b in unit.buffers if b.name == "relu"] == ["output"]
    reply = w.try_({"kernel_knobs": {k["signature"]: {"THREADS": 1}}, "rounds": 3})
    assert reply.get("scope") == "kernel", reply


def test_kernels_that_update_what_they_read_are_not_carved():
    from strata.loop.ir import BufferInfo, LoopKernel, LoopProgram
    bufs = [BufferInfo("a", (4,), "f32", "input"), BufferInfo("b", (4,), "f32", "temp"),
            BufferInfo("c", (4,), "f32", "output")]
    k1 = LoopKernel("k1", (), ("a",), ("b",))
    k2 = LoopKernel("k2", (), ("b",), ("c",))
    k3 = LoopKernel("k3", (), ("c",), ("a",))            # writes what k1 read
    program = LoopProgram(bufs, [k1, k2, k3], ["c"])
    unit = units.carve(program, {"k1", "k2"})
    assert [(b.name, b.kind) for b in unit.buffers] == [("a", "input"), ("b", "output"),
                                                         ("c", "output")]
    assert units.carve(program, {"k1", "k3"}) is None
    assert units.carve(program, {"k2"}).outputs == ["c"]
