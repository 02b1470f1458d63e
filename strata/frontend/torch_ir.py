"""Torch IR: the captured aten graph, one node per op, with readable names and provenance.

A `TorchProgram` keeps the fx graph torch.export produced (post-decomposition) and a flat,
renamed view of it that the printer and `strata.tensor.decompose` read: `TorchNode`s whose
arguments refer to earlier nodes through `Ref(name)`. Each node knows the user's source line it
came from (`Where`), which names the line in printed IR and in `unsupported op` errors.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..core import dtypes


@dataclass(frozen=True)
class TorchType:
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        inner = ", ".join(map(str, self.shape)) + ("," if len(self.shape) == 1 else "")
        return f"({inner}) {self.dtype}"


@dataclass(frozen=True)
class Ref:
    """An argument that is the value of another node (or input / weight)."""
    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Where:
    """The user's source line a node came from."""
    file: str
    line: int
    code: str = ""

    @property
    def loc(self) -> str:
        return f"{self.file}:{self.line}"

    def __str__(self) -> str:
        return f"{self.loc} `{self.code}`" if self.code else self.loc


@dataclass
class TorchNode:
    name: str
    op: str                    # "aten.add.Tensor", or "getitem"
    target: Any                # the OpOverload (or operator.getitem)
    args: tuple
    kwargs: dict
    type: TorchType | tuple | None   # tuple of TorchType for multi-output ops
    where: Where | None = None
    module: str = ""           # the innermost nn.Module it ran in ("layers.3.mlp"), if known

    @property
    def packet(self) -> str:
        """The op without its overload: "aten.add"."""
        parts = self.op.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else self.op


@dataclass
class TorchProgram:
    graph: Any                                   # torch.fx.Graph, post-decomposition
    nodes: list[TorchNode]
    inputs: dict[str, TorchType]                 # user inputs, in order
    weights: dict[str, Any]                      # name -> torch.Tensor (params, buffers, constants)
    weight_types: dict[str, TorchType]
    outputs: list[str]
    out_spec: Any = None                         # pytree spec of the eager output
    exported: Any = field(default=None, repr=False)
    # inputs the program updates in place (index_copy_, x[:, pos] = v): input -> its new value
    mutations: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # what capture changed to export it (-v)
    weight_of: dict[str, str] = field(default_factory=dict)   # state-dict key -> weight name
    derived: dict[str, tuple] = field(default_factory=dict)   # weight -> those it concatenates

    @property
    def input_names(self) -> list[str]:
        return list(self.inputs)

    def node(self, name: str) -> TorchNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def where(self, name: str) -> str:
        """The user's line of node `name`, as used in error messages ("" when unknown)."""
        w = self.node(name).where
        return str(w) if w else ""

    def unflatten(self, flat_outputs: list):
        """Rebuild the eager output structure (tensor, tuple, list ...) from flat outputs."""
        if self.out_spec is None:
            return flat_outputs[0] if len(flat_outputs) == 1 else tuple(flat_outputs)
        import torch.utils._pytree as pytree
        return pytree.tree_unflatten(list(flat_outputs), self.out_spec)

    def __str__(self) -> str:
        return format_program(self)


def shape_only(t) -> bool:
    """A meta or fake tensor: a weight with a shape and a dtype but no values (a model compiled
    from shapes only). Compiling needs nothing more; running does."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, torch.Tensor) and (t.is_meta or isinstance(t, FakeTensor))


# ---------------------------------------------------------------- provenance

STRATA = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # strata's own files
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*\n(?P<code>[^\n]*)')


def _is_library(file: str) -> bool:
    """torch, strata itself and the standard library are never "the user's code"."""
    import torch
    if file.startswith((os.path.dirname(torch.__file__), STRATA)):
        return True
    stdlib = os.path.dirname(os.__file__)
    return file.startswith(stdlib) and "-packages" not in file


def user_frame(stack_trace: str | None) -> Where | None:
    """The innermost frame of the user's code in a torch.export stack trace."""
    if not stack_trace:
        return None
    frames = [(m["file"], int(m["line"]), m["code"].strip()) for m in _FRAME.finditer(stack_trace)]
    for file, line, code in reversed(frames):
        if (file.startswith("<") and file != "<snippet>") or _is_library(file):
            continue
        if "-packages" + os.sep in file:       # an installed library (transformers): from its package
            file = file.split("-packages" + os.sep, 1)[1]
        else:
            try:
                rel = os.path.relpath(file)
                file = rel if not rel.startswith("..") else file
            except ValueError:
                pass
        return Where(file, line, code)
    return None


# ---------------------------------------------------------------- printing

def format_arg(a) -> str:
    if isinstance(a, Ref):
        return a.name
    if isinstance(a, (list, tuple)):
        inner = ", ".join(format_arg(x) for x in a)
        return f"[{inner}]"
    if isinstance(a, bool) or a is None:
        return repr(a)
    if isinstance(a, float):
        return repr(a)
    if type(a).__name__ == "dtype":
        return dtypes.from_torch(a)
    if type(a).__name__ in ("device", "layout", "memory_format"):
        return str(a).replace("torch.", "")
    return str(a)


def format_node(n: TorchNode) -> tuple[str, str]:
    op = n.op.split(".")[1] if n.op.startswith("aten.") else n.op
    args = [format_arg(a) for a in n.args]
    args += [f"{k}={format_arg(v)}" for k, v in n.kwargs.items()]
    if isinstance(n.type, tuple):
        ty = "(" + ", ".join(str(t) for t in n.type) + ")"
    else:
        ty = str(n.type)
    return f"{n.name} = {op}({', '.join(args)})", ty


def format_program(p: TorchProgram) -> str:
    out = [f"{name}: input {t}" for name, t in p.inputs.items()]
    out += [f"{name}: weight {t}" + (f" = cat({', '.join(p.derived[name])})" if name in p.derived
                                     else "") for name, t in p.weight_types.items()]
    rows = [(n, *format_node(n)) for n in p.nodes]
    width = max((len(lhs) for _, lhs, _ in rows), default=0)
    last = None
    for n, lhs, ty in rows:
        if n.where is not None and n.where != last:
            out.append(f"# {n.where.loc}  {n.where.code}".rstrip())
            last = n.where
        out.append(f"{lhs.ljust(width)}  -> {ty}")
    out.append(f"return {', '.join(p.outputs)}")
    return "\n".join(out)
