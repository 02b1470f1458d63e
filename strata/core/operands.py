"""The operand protocol of every statement IR (Loop, Tile and Kernel IR), as `Expr` has
children()/map_children(): a statement's operands follow from its dataclass fields' declared
types, so walks ask the statement instead of listing fields by hand.

    exprs()         the expressions it holds itself (`Expr`, `Expr | None`, `tuple[Expr, ...]`)
    bodies()        its nested statement lists (`tuple[Stmt, ...]`, or `Body`)
    buffers()       the arrays it names itself (`BufName`), not those inside a load
    map_exprs(fn), map_bodies(fn)   the same statement rebuilt

A field typed otherwise (a name, a size, a flag) is no operand. A statement whose bodies sit
deeper (Tile IR's MmaLoop, in its operands) overrides bodies() and map_bodies()."""
from __future__ import annotations

from dataclasses import replace

BufName = str       # a field naming an array
Body = tuple        # a field holding a nested list of statements

_ROLES = {"Expr": "expr", "Expr | None": "expr", "tuple[Expr, ...]": "exprs",
          "tuple[Stmt, ...]": "body", "Body": "body", "BufName": "buf"}


class Operands:
    _operands: tuple[tuple[str, str], ...] = ()        # (field, role), in field order
    _bodies: tuple[str, ...] = ()                      # the "body" fields: walks ask most often

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fields = {}                 # a subclass's fields follow its bases' (dataclass order)
        for base in reversed(cls.__mro__):
            fields.update(base.__dict__.get("__annotations__", {}))
        cls._operands = tuple((n, _ROLES[t]) for n, t in fields.items() if t in _ROLES)
        cls._bodies = tuple(n for n, role in cls._operands if role == "body")

    def exprs(self) -> tuple:
        out = []
        for name, role in self._operands:
            value = getattr(self, name)
            if role == "expr" and value is not None:
                out.append(value)
            elif role == "exprs":
                out.extend(value)
        return tuple(out)

    def map_exprs(self, fn):
        changes = {}
        for name, role in self._operands:
            value = getattr(self, name)
            if role == "expr" and value is not None:
                changes[name] = fn(value)
            elif role == "exprs":
                changes[name] = tuple(fn(e) for e in value)
        return replace(self, **changes) if changes else self

    def bodies(self) -> tuple:
        if not self._bodies:
            return ()
        return tuple(getattr(self, name) for name in self._bodies)

    def map_bodies(self, fn):
        if not self._bodies:
            return self
        return replace(self, **{name: fn(getattr(self, name)) for name in self._bodies})

    def buffers(self) -> tuple[str, ...]:
        return tuple(getattr(self, name) for name, role in self._operands if role == "buf")
