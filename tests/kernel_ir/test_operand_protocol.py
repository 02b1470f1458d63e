"""The operand protocol (kernel_ir/ir.py): a statement kind written once, as a dataclass with typed
fields and its printed line, is walked, printed, verified, turned into thread loops, costed and
renamed by the code that exists; only an emitter that prints it needs a method (and its entry
in the emitter's PRINTERS). The kind here
(a prefetch hint) lives in this test alone, so nothing in strata knows it by name."""
from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from strata.core import expr as E
from strata.codegen.c import CEmitter
from strata.core.expr import Expr
from strata.kernel_ir.ir import (BufName, For, Kernel, KernelProgram, Let, Param, Stmt, ThreadIdx,
                                 format_kernel, walk)
from strata.kernel_ir.thread_loops import to_thread_loops
from strata.kernel_ir.twins import twin
from strata.kernel_ir.verify import KernelVerifyError, verify_kernel
from strata.tune.cost import kernel_work


@dataclass(frozen=True)
class Prefetch(Stmt):
    """Bring buf[index] towards the core (a hint: nothing changes if it is dropped)."""
    buf: BufName
    index: Expr

    def to_text(self, fmt):
        return f"prefetch {self.buf}[{fmt(self.index)}]"


def kernel(index: Expr, buf: str = "x", block: int = 1) -> Kernel:
    loop = For("i", E.const(0, "i32"), E.const(64, "i32"), 16, (Prefetch(buf, index),))
    return Kernel("k", (Param("x", "f32", 64), Param("y", "f32", 64, output=True)), 1, block,
                  (loop,))


def test_protocol_derives_operands_from_field_types():
    s = Prefetch("x", E.Var("i", "i32"))
    assert s.exprs() == (E.Var("i", "i32"),) and s.buffers() == ("x",) and s.bodies() == ()
    moved = s.map_exprs(lambda e: E.add(e, 16))
    assert moved.index == E.add(E.Var("i", "i32"), 16) and moved.buf == "x"


def test_walked_printed_and_verified_without_edits():
    k = kernel(E.Var("i", "i32"))
    assert any(isinstance(s, Prefetch) for s in walk(k.body))
    assert "        prefetch x[i]" in format_kernel(k).splitlines()
    verify_kernel(k, gpu=False)
    with pytest.raises(KernelVerifyError, match=r"uses undefined \['j'\]"):
        verify_kernel(kernel(E.Var("j", "i32")), gpu=False)
    with pytest.raises(KernelVerifyError, match="unknown buffer z"):
        verify_kernel(kernel(E.Var("i", "i32"), buf="z"), gpu=False)


def test_thread_loops_rewrite_its_thread_index():
    one = to_thread_loops(kernel(E.add(E.Var("i", "i32"), ThreadIdx()), block=4))
    assert one.block == 1
    (p,) = [s for s in walk(one.body) if isinstance(s, Prefetch)]
    assert "st_thread" in E.to_str(p.index) and "threadIdx" not in E.to_str(p.index)


def test_cost_model_counts_its_buffer_and_twins_rename_it():
    flops, moved = kernel_work(kernel(E.Var("i", "i32")))
    assert flops == 0 and moved == 2 * 64 * 4
    k = kernel(E.Var("i", "i32"))
    renamed = replace(k, params=(Param("a", "f32", 64), Param("b", "f32", 64, output=True)))
    copy = twin(k, _tile(k), _tile(renamed))
    assert [s.buf for s in walk(copy.body) if isinstance(s, Prefetch)] == ["a"]


def test_an_emitter_prints_it_with_one_method():
    k = kernel(E.Var("i", "i32"))
    with pytest.raises(TypeError, match="CEmitter has no printer for Prefetch"):
        CEmitter(k).kernel()

    class WithPrefetch(CEmitter):
        PRINTERS = {**CEmitter.PRINTERS, Prefetch: "prefetch"}

        def prefetch(self, s, depth):
            self.emit(f"__builtin_prefetch(&{s.buf}[{self.expr(s.index)}]);", depth)
    assert "__builtin_prefetch(&x[i]);" in WithPrefetch(k).kernel()


def _tile(k: Kernel):
    """The fields of a Tile IR kernel that twin() reads: its name, source line and buffers."""
    return type("TileKernelStandIn", (), {"name": k.name, "src": "", "buffers": k.params})()


def test_program_with_it_is_a_program():
    k = kernel(E.Var("i", "i32"))
    assert str(KernelProgram([], [k], [])).startswith("kernel k(")
