"""`-c` snippets: one Python expression turned into a module plus example inputs.

`torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))` becomes a module whose forward(x) computes
`rmsnorm(x)`: every random-tensor call (torch.randn, rand, randint, *_like) is a graph input,
named x, y, z, x3, x4 ... in order of appearance, and every nn.Module construction is hoisted and
built once (after torch.manual_seed(0)), so its parameters become weights. The expression itself
is only run on fake tensors here (`dry_run`): capture never computes the program. Everything else
(python numbers, torch.full, torch.arange ...) stays in the expression and is captured as part of
the graph. The code is compiled with the file name "<snippet>" and registered in `linecache`, so
torch.export's stack traces, hence every node's provenance, point at the snippet itself.
"""
from __future__ import annotations

import ast
import contextlib
import linecache
import logging
import math
import os
import sys
from dataclasses import dataclass

import torch
from torch import nn

from ..core.cpu_load import available_bytes
from ..core.errors import DataDependentShape, SnippetError, StrataError
from .static_experts import static_experts

FILENAME = "<snippet>"
RANDOM_CALLS = {"torch.randn", "torch.rand", "torch.randint", "torch.randn_like",
                "torch.rand_like", "torch.randint_like", "torch.normal"}


def namespace() -> dict:
    """The names a snippet may use."""
    return {"torch": torch, "nn": nn, "F": torch.nn.functional, "math": math}


BIG_INPUT = 256 << 20      # an input larger than this is made only when the snippet is run


@dataclass
class Deferred:
    """A large random input not made yet: its shape (a fake tensor) and how to make it as the
    parse would have (the expression, and the random state just before it)."""
    fake: torch.Tensor
    node: ast.expr
    ns: dict
    rng: torch.Tensor

    def make(self) -> torch.Tensor:
        keep = torch.get_rng_state()
        torch.set_rng_state(self.rng)
        try:
            return _eval_node(self.node, self.ns)
        finally:
            torch.set_rng_state(keep)


@dataclass
class Snippet:
    source: str
    module: nn.Module                  # forward(*inputs) evaluates the expression
    inputs: tuple                      # tensors, in input order; a large one is a Deferred
    input_names: list[str]

    @property
    def shapes(self) -> tuple:
        """What compiling needs: the small inputs, fake tensors for the large ones."""
        return tuple(x.fake if isinstance(x, Deferred) else x for x in self.inputs)

    @property
    def example_inputs(self) -> tuple:
        """The inputs as tensors, the large ones made now (one sentence if they cannot fit)."""
        deferred = [x for x in self.inputs if isinstance(x, Deferred)]
        if deferred:
            need = sum(t.numel() * t.element_size() for t in self.shapes
                       if isinstance(t, torch.Tensor))
            free = available_bytes()
            if free is not None and need > free:
                raise SnippetError(f"the snippet's inputs need {need / 2**30:.1f} GiB and this "
                                   f"machine has {free / 2**30:.1f} GiB free: compiling them works "
                                   f"(strata compile), running them does not")
            self.inputs = tuple(x.make() if isinstance(x, Deferred) else x for x in self.inputs)
        return self.inputs

    def source_lines(self) -> dict[str, str]:
        """What `capture` registers in linecache so provenance shows the snippet's text."""
        return {FILENAME: self.source}


class SnippetModule(nn.Module):
    """The snippet as a module: hoisted modules are submodules, forward runs the expression."""

    def __init__(self, fn, modules: dict[str, nn.Module]):
        super().__init__()
        self._fn = fn
        self._names = list(modules)
        for name, m in modules.items():
            self.add_module(name, m)

    def forward(self, *inputs):
        return self._fn(*[getattr(self, n) for n in self._names], *inputs)


def input_name(i: int) -> str:
    return ("x", "y", "z")[i] if i < 3 else f"x{i}"


def register_source(filename: str, source: str) -> None:
    """Make `source` what tracebacks (and torch.export stack traces) show for `filename`."""
    lines = source.splitlines(True) or [""]
    linecache.cache[filename] = (len(source), None, lines, filename)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _eval_node(node: ast.expr, ns: dict):
    expr = ast.Expression(node)
    ast.fix_missing_locations(expr)
    return eval(compile(expr, FILENAME, "eval"), ns)


class _Hoist(ast.NodeTransformer):
    """Replaces random-tensor calls by input names and module constructions by module names."""

    def __init__(self, ns: dict):
        self.ns = ns
        self.inputs: list[tuple[str, torch.Tensor]] = []
        self.modules: dict[str, nn.Module] = {}

    def _module_class(self, func: ast.expr):
        if _dotted(func) is None:
            return None
        try:
            value = _eval_node(func, self.ns)
        except Exception:
            return None
        return value if isinstance(value, type) and issubclass(value, nn.Module) else None

    def visit_Call(self, node: ast.Call):
        callee = _dotted(node.func)
        if callee in RANDOM_CALLS:
            with torch.device("meta"):             # its size, without making it (nor importing
                meta = _eval_node(node, self.ns)   # torch._dynamo, as fake tensors would)
            if isinstance(meta, torch.Tensor) and meta.numel() * meta.element_size() > BIG_INPUT:
                from torch._subclasses.fake_tensor import FakeTensorMode
                self.fakes = getattr(self, "fakes", None) or FakeTensorMode()   # one per snippet
                rng = torch.get_rng_state()
                with self.fakes:
                    value = Deferred(_eval_node(node, self.ns), node, self.ns, rng)
            else:
                value = _eval_node(node, self.ns)
            if not isinstance(value, (torch.Tensor, Deferred)):
                raise SnippetError(f"{callee}(...) did not produce a tensor.")
            name = input_name(len(self.inputs))
            self.inputs.append((name, value))
            return ast.copy_location(ast.Name(name, ast.Load()), node)
        cls = self._module_class(node.func)
        if cls is not None:
            module = _eval_node(node, self.ns).eval()
            base = cls.__name__.lower()
            name, k = base, 1
            while name in self.modules or name in self.ns:
                name, k = f"{base}_{k}", k + 1
            self.modules[name] = module
            return ast.copy_location(ast.Name(name, ast.Load()), node)
        return self.generic_visit(node)


def parse_snippet(code: str, dry: bool = True) -> Snippet:
    """Parse a snippet and check it on fake tensors (`dry_run`; dry=False skips that, for a
    snippet already captured: it imports torch._dynamo); any failure is one sentence."""
    code = code.strip()
    try:
        tree = ast.parse(code, filename=FILENAME, mode="eval")
    except SyntaxError as e:
        raise SnippetError(f"the snippet is not a Python expression: {e.msg} "
                           f"(line {e.lineno}, column {e.offset}).") from None
    register_source(FILENAME, code)
    ns = namespace()
    torch.manual_seed(0)
    hoist = _Hoist(ns)
    try:
        body = hoist.visit(tree.body)
        params = [ast.arg(n) for n in list(hoist.modules) + [n for n, _ in hoist.inputs]]
        lam = ast.Lambda(ast.arguments([], params, None, [], [], None, []), body)
        lam = ast.copy_location(lam, tree.body)
        fn = _eval_node(lam, ns)
        fn.__code__ = fn.__code__.replace(co_name="forward")   # export keeps "forward" frames
        module = SnippetModule(fn, hoist.modules)
        inputs = tuple(t for _, t in hoist.inputs)
        outputs = dry_run(module, [getattr(t, "fake", t) for t in inputs]) if dry else [()]
    except StrataError:
        raise
    except Exception as e:
        msg = (str(e).strip().splitlines() or [""])[0].replace("'FakeTensor' object", "a tensor")
        raise SnippetError(f"the snippet failed to evaluate: {type(e).__name__}: {msg}") from None
    if not outputs:
        raise SnippetError("the snippet computes no tensor; strata compiles tensor programs "
                           "(write its inputs as torch.randn(...) calls)")
    return Snippet(code, module, inputs, [n for n, _ in hoist.inputs])


@contextlib.contextmanager
def quiet_torch():
    """Keep torch's own error logging (a traceback logged by fake tensors before they raise)
    off the user's terminal: strata reports the error itself, in one sentence."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level, log.level = log.level, logging.CRITICAL
    try:
        yield
    finally:
        log.level = level


def user_line(exc: BaseException) -> str:
    """"file:line" of the innermost frame of `exc` in the user's code (not torch's, not
    strata's), "" when there is none."""
    skip = tuple(os.path.dirname(m.__file__) for m in (torch, sys.modules["strata"]))
    tb, where = exc.__traceback__, ""
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if not f.startswith(skip) and "/site-packages/" not in f and "importlib" not in f:
            where = f"{f}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def dry_run(module, inputs) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each tensor `module(*inputs)` returns, found on fake tensors: the
    program is checked without computing anything (a 4096^3 bf16 matmul takes minutes on a CPU).
    A data-dependent shape (x[x > 0], nonzero, .item()) is one sentence."""
    from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                               DynamicOutputShapeException, FakeTensorMode)
    with quiet_torch(), FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad(), \
            static_experts(module):
        fakes = [_refake(mode, t) if isinstance(t, torch.Tensor) else t for t in inputs]
        try:
            out = module(*fakes)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            raise DataDependentShape(getattr(e, "func", ""), user_line(e)) from None
    return [(tuple(t.shape), t.dtype) for t in torch.utils._pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor)]


def _refake(mode, t: torch.Tensor) -> torch.Tensor:
    """`t` as a fake tensor of `mode` (a fake of another mode: a new one of its shape)."""
    from torch._subclasses.fake_tensor import FakeTensor
    if isinstance(t, FakeTensor):
        with mode:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    return mode.from_tensor(t)
