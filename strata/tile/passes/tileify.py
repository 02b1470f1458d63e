"""tileify: lift the kernel's outer free loops into the parallel domain of a TileKernel.

Statements before the outer loops become the prelude (a reduction to one value among them, ahead
of a contraction's rows: block_prelude_reduce.py has each block's threads compute it together).
If a row still holds loops (reductions, inner free loops) the kernel is scheduled by rows,
otherwise element by element. Perfectly nested inner free loops are flattened into one so that a
group of threads can share it.
"""
from __future__ import annotations

from math import prod

from ...core.context import Context
from ...core.errors import StrataError
from ...core.expr import Var, floordiv, mod
from ...loop.attention import attention_of
from ...loop.custom import custom_of
from ...loop.ir import Let, Load, Loop, LoopKernel
from ..ir import TileKernel, map_body, subst_body


def _flatten_free(loop: Loop) -> Loop:
    chain = [loop]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop) and chain[-1].body[0].kind == "free":
        chain.append(chain[-1].body[0])
    if len(chain) == 1:
        return loop
    extent = prod(l.extent for l in chain)
    flat = Var(chain[0].var)
    mapping, stride = {}, extent
    for l in chain:
        stride //= l.extent
        mapping[l.var] = mod(floordiv(flat, stride), l.extent, {flat.name: extent})
    mapping[chain[0].var] = floordiv(flat, extent // chain[0].extent, {flat.name: extent})
    body = subst_body(chain[-1].body, mapping, {flat.name: extent})
    return Loop(chain[0].var, extent, "free", body)


def _reduces(loop: Loop) -> bool:
    return any(isinstance(s, Loop) and (s.kind == "reduce" or _reduces(s)) for s in loop.body)


def tileify(k: LoopKernel | TileKernel, ctx: Context, buffers: tuple = ()) -> TileKernel:
    if isinstance(k, TileKernel):       # scheduled already (tile_attention)
        return k
    if custom_of(k) is not None:        # a hand-written kernel keeps its own launch
        return TileKernel(k.name, "custom", (), (), k.body, reads=k.reads, writes=k.writes,
                          buffers=buffers, src=k.src)
    if attention_of(k) is not None:     # only the GPU pipeline has tile_attention
        raise StrataError(f"{k.name}: fused attention has no {ctx.arch.kind.upper()} schedule "
                          f"yet; run it with --device sim or on a GPU")
    body = k.body
    prelude = ()
    if body and isinstance(body[-1], Loop) and body[-1].kind == "free" \
            and all(isinstance(s, (Let, Load)) or isinstance(s, Loop) and s.kind == "reduce"
                    and _reduces(body[-1]) for s in body[:-1]):
        # a reduce loop before a contraction's rows: a value each block sums (fuse.py);
        # before elementwise work (softmax of one row) the kernel stays one row
        prelude, body = body[:-1], body[-1:]
    domain = []
    while len(body) == 1 and isinstance(body[0], Loop) and body[0].kind == "free":
        domain.append((body[0].var, body[0].extent))
        body = body[0].body
    rows = any(isinstance(s, Loop) for s in body)
    if rows:
        body = map_body(body, lambda s: _flatten_free(s) if isinstance(s, Loop) and s.kind == "free" else s)
    mode = "rows" if rows else "elementwise"
    ctx.log(f"tileify: {k.name}: {mode} over {' x '.join(str(e) for _, e in domain) or 'one point'}", 2)
    return TileKernel(k.name, mode, tuple(domain), prelude, body, reads=k.reads, writes=k.writes,
                      buffers=buffers, src=k.src, knobs=k.knobs)
