"""Loop kernels of a Scatter (index_copy / index_put): only the new rows are stored.

Why: a KV-cache write must not copy the whole cache per decode step. A Scatter whose destination
is a buffer nothing else reads (a program input such as the cache, or a temp) and that is not
itself returned is stored *in place*: its buffer is the destination's, the kernel runs over the
rows written (`values`' shape) and stores `dest[.., pos, ..] = value`, and the program returns the
destination buffer (for an input: the caller's tensor, updated). Otherwise a copy kernel first
copies the destination into the Scatter's own buffer. A position is clamped into range so that
a kernel never writes outside its buffer (callers check positions; the simulator would too).
Also the copies around an input updated in place: its new value written back last (write_back)
and, where the program returns it as it was, its old value copied first (snapshots); none where
the kernel computing the new value can store it in the input's buffer itself (stored_in_place).
"""
from __future__ import annotations

from ..core.expr import Const, Var, call
from ..tensor.ir import Input, Scatter, TensorProgram
from .builder import LoopBuilder
from .ir import Load, Loop, LoopKernel, Store, canonical_names, walk


def _chain_inputs(prog: TensorProgram) -> set[str]:
    """Inputs the program updates in place with a chain of scatters starting at the input."""
    by_name, out = prog.by_name, set()
    for inp, value in prog.mutations.items():
        n = by_name[value]
        while isinstance(n, Scatter) and n.dest != inp:
            n = by_name[n.dest]
        if isinstance(n, Scatter):
            out.add(inp)
    return out


def aliases(prog: TensorProgram) -> dict[str, str]:
    """{scatter node: buffer it is stored in} for every Scatter written in place. A caller's
    tensor (an input) is written only when the program updates it in place (index_copy_,
    `cache[:, :, pos] = k`): a functional index_copy of an input gets a copy."""
    users = prog.users()
    by_name = prog.by_name
    writable = _chain_inputs(prog)
    out: dict[str, str] = {}
    for n in prog.nodes:
        if not isinstance(n, Scatter):
            continue
        if isinstance(by_name[n.dest], Input) and n.dest not in writable:
            continue
        if users[n.dest] == [n.name] and n.dest not in prog.outputs:
            out[n.name] = out.get(n.dest, n.dest)
    return out


def write_back(prog: TensorProgram, materialized: set[str], alias: dict[str, str]
               ) -> list[LoopKernel]:
    """A copy kernel per input updated in place whose new value is not already in its buffer
    (run last: every kernel reading the old value has run; an empty input has nothing to copy)."""
    out = []
    for inp, value in prog.mutations.items():
        if alias.get(value) != inp and prog.node(inp).type.numel:
            out.append(_copy_kernel(prog, prog.node(value), inp, materialized, f"k_update_{inp}"))
    return out


def stored_in_place(prog: TensorProgram, kernels: list[LoopKernel], alias: dict[str, str]
                    ) -> dict[str, str]:
    """{new value: input} for each input updated in place whose new value one kernel stores
    point by point, reading the input only at the point it stores and before it, and which no
    later kernel reads (an optimizer's parameters and moments, `p.add_(g)`): that kernel's store
    goes straight into the input's buffer. Why: a write-back copy reads and writes every updated
    element once more (AdamW: three of its seven streams again, 1.7x Inductor's step)."""
    out: dict[str, str] = {}
    for inp, value in prog.mutations.items():
        writers = [k for k, kern in enumerate(kernels) if value in kern.writes]
        if (isinstance(prog.node(value), (Input, Scatter)) or value in alias or value in out
                or value in prog.outputs or inp in alias.values() or len(writers) != 1):
            continue
        at = writers[0]
        if any(inp in k.reads or inp in k.writes for k in kernels[at + 1:]):
            continue                            # the old value is read later: keep the copy
        if _point_update(kernels[at].body, value, inp):
            out[value] = inp
    return out


def _point_update(body, value: str, inp: str) -> bool:
    """Whether `body` stores `value` once, and loads `inp` only at that index, in the same loop
    body before the store (each point's old value read before the point is overwritten)."""
    found = []

    def visit(stmts):
        for at, s in enumerate(stmts):
            if isinstance(s, Store) and s.buf == value:
                found.append((stmts[:at], s.index))
            for inner in s.bodies():
                visit(inner)
    visit(body)
    if len(found) != 1:
        return False
    before, index = found[0]
    return all(s.index == index and any(s is t for t in before)
               for s in walk(body) if isinstance(s, Load) and s.buf == inp)


def snapshots(prog: TensorProgram, materialized: set[str]) -> tuple[dict[str, str], list[LoopKernel]]:
    """{input: output buffer of its own} and their copy kernels (run first), for each input the
    program returns as it was *before* updating it in place (`b = g.clone(); g.add_(1); return
    b`: clone is the value itself, so the Tensor IR output is the input). Returned as the input's
    buffer, it would hold the new value once write_back (or an in-place scatter) has run."""
    taken, out, kernels = set(prog.by_name), {}, []
    for o in prog.outputs:
        if o in prog.mutations and o not in out:
            name, n = f"{o}_before", 1
            while name in taken:
                n += 1
                name = f"{o}_before{n}"
            taken.add(name)
            out[o] = name
            if prog.node(o).type.numel:
                kernels.append(_copy_kernel(prog, prog.node(o), name, materialized, f"k_{name}"))
    return out, kernels


def rename_buffers(kernels: list[LoopKernel], alias: dict[str, str]) -> list[LoopKernel]:
    """Every access to an aliased Scatter made to the buffer it lives in."""
    if not alias:
        return kernels

    def body(stmts):
        out = []
        for s in stmts:
            if isinstance(s, Load) and s.buf in alias:
                s = Load(s.var, alias[s.buf], s.index, s.dtype, s.pred)
            elif isinstance(s, Store) and s.buf in alias:
                s = Store(alias[s.buf], s.index, s.value)
            elif isinstance(s, Loop):
                s = Loop(s.var, s.extent, s.kind, body(s.body), s.accs, s.unroll)
            out.append(s)
        return tuple(out)

    def names(bufs):
        return tuple(dict.fromkeys(alias.get(b, b) for b in bufs))

    return [LoopKernel(k.name, body(k.body), names(k.reads), names(k.writes), src=k.src)
            for k in kernels]


def scatter_kernels(prog: TensorProgram, kps, materialized: set[str], name: str,
                    alias: dict[str, str]) -> list[LoopKernel]:
    """The copy kernel (unless in place) and the kernel that stores the rows: of one Scatter, or
    of siblings (`siblings`), one loop nest storing each one's rows at the positions read once."""
    kps = kps if isinstance(kps, list) else [kps]
    nodes = [prog.node(kp.target) for kp in kps]
    out = [_copy_kernel(prog, prog.node(n.dest), n.name, materialized, f"{name}_copy")
           for n in nodes if n.name not in alias]
    n = nodes[0]
    b = LoopBuilder(prog, materialized, set())
    vshape = prog.node(n.values).type.shape
    index: list = [Const(0)] * len(vshape)
    for d in kps[0].outer:
        index[d] = Var(b.open_loop(vshape[d], "free"))
    for v in index:                   # all outer loops count as one level
        if isinstance(v, Var):
            b.home[v.name] = b.stack[-1]
    raw = b.value(n.indices, (index[n.axis],))
    last = Const(n.type.shape[n.axis] - 1, "i64")
    pos = b.let(call("minimum", call("maximum", raw, Const(0, "i64")), last), prefix="pos")
    dest_index = tuple(pos if d == n.axis else e for d, e in enumerate(index))
    for m in nodes:
        b.stack[-1].stmts.append(Store(m.name, dest_index, b.value(m.values, tuple(index))))
    while len(b.stack) > 1:
        b.close_loop()
    kernel = LoopKernel(name, tuple(b.root.stmts), tuple(b.reads), tuple(m.name for m in nodes),
                        src=n.src)
    out.append(canonical_names(kernel, reserved=set(prog.by_name)))
    return out


def siblings(prog: TensorProgram, kps: list, materialized: set[str], alias: dict[str, str]
             ) -> bool:
    """Whether consecutive Scatters `kps` can be one kernel: each in place (the K and V caches of
    a layer), the same positions and axis over rows of the same shape, and none reading what
    another writes. Why: a decode step writes two caches per layer, each a tiny kernel of its
    own (on a GPU, a launch of one block that the next kernel waits for)."""
    nodes = [prog.node(kp.target) for kp in kps]
    first = nodes[0]
    if not all(isinstance(m, Scatter) and m.name in alias and m.indices == first.indices
               and m.axis == first.axis and kp.outer == kps[0].outer
               and prog.node(m.values).type.shape == prog.node(first.values).type.shape
               for m, kp in zip(nodes, kps)):
        return False
    alone = [scatter_kernels(prog, kp, materialized, "k", alias)[-1] for kp in kps]
    written = [set(k.writes) | {alias[m.name]} for k, m in zip(alone, nodes)]
    return all(not (set(k.reads) | {alias.get(r, r) for r in k.reads}) & w
               for i, k in enumerate(alone) for j, w in enumerate(written) if i != j)


def _copy_kernel(prog: TensorProgram, src, dest: str, materialized: set[str], name: str
                 ) -> LoopKernel:
    """dest[...] = src[...] (src a node with a buffer)."""
    b = LoopBuilder(prog, materialized, set())
    index = [Var(b.open_loop(s, "free")) if s > 1 else Const(0) for s in src.type.shape]
    for v in index:
        if isinstance(v, Var):
            b.home[v.name] = b.stack[-1]
    value = b.value(src.name, tuple(index))
    b.stack[-1].stmts.append(Store(dest, tuple(index), value))
    while len(b.stack) > 1:
        b.close_loop()
    kernel = LoopKernel(name, tuple(b.root.stmts), tuple(b.reads), (dest,), src=src.src)
    return canonical_names(kernel, reserved=set(prog.by_name))

