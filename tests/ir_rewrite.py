"""Rewrite every statement of a Kernel IR program: how tests break a schedule on purpose (drop
a wait, swap a fragment) to show the simulator catches it."""
from __future__ import annotations

from dataclasses import replace

from strata.kernel_ir.ir import For, If, KernelProgram


def rewrite(prog: KernelProgram, fn) -> KernelProgram:
    """prog with every statement passed through fn (which returns it, a replacement, or None)."""
    def body(stmts):
        out = []
        for s in stmts:
            if isinstance(s, For):
                s = replace(s, body=body(s.body))
            elif isinstance(s, If):
                s = replace(s, then=body(s.then), orelse=body(s.orelse))
            s = fn(s)
            if s is not None:
                out.append(s)
        return tuple(out)
    return KernelProgram(prog.buffers, [replace(k, body=body(k.body)) for k in prog.kernels],
                         prog.outputs)
