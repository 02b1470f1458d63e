"""strata's imports point down (issue 30): read from the sources with `ast`, every import of every
strata/**/*.py, at module level and inside functions, relative ones resolved.

  (a) the module graph has no circle;
  (b) an import inside a function keeps something heavy lazy, and nothing else does: a module of a
      HEAVY package that its module does not import at the top already (`import strata` and
      `strata --help` must not pay for it), or a strata module whose module-level imports reach a
      HEAVY package that the importing module's do not;
  (c) a module imports only its own layer or the layers below it (LAYERS, bottom first).

Why a rule rather than comments: the test computes which imports keep something heavy lazy, so an
import that stops doing so (its target became light, or its module imports the heavy package
anyway) fails here instead of keeping a comment that is no longer true.
"""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "strata"

# The layers, bottom first: (name, modules under strata., why here). A module belongs to the entry
# naming the longest prefix of its name (tune.db before tune); "" is the package itself.
LAYERS = (
    ("shared", ("core", "version"),
     "the words every stage speaks (dtypes, expressions, operands, targets, knobs, errors) and "
     "small helpers"),
    ("frontend", ("frontend",), "stage 1: PyTorch -> Torch IR (torch.export)"),
    ("tensor", ("tensor",), "stage 2: Torch IR -> Tensor IR"),
    ("loop", ("loop",), "stage 3: fusion into Loop IR"),
    ("tile", ("tile",), "stage 4: schedules, as Tile IR and its passes"),
    ("kernel_ir", ("kernel_ir",), "stage 5: Kernel IR, its lowering from Tile IR and its simulator"),
    ("codegen", ("codegen",), "stage 6: the emitters of Kernel IR (CUDA C, C, OpenCL, HIP, Metal)"),
    ("runtime", ("runtime",), "stage 7: builds and launches what the emitters wrote"),
    ("pipeline", ("pipeline", "tune.machine", "tune.db", "tune.cost", "tune.static_cost"),
     "runs the stages in order; beside it what a compile or an estimate reads: the tuning "
     "database, this CPU's cached profile, the cost model of Kernel IR and of its machine code"),
    ("library", ("view", "models", "quant"),
     "what the entry points build on: the page of a compilation, the models and their weight formats"),
    ("api", ("api", "torch_compile", "dsl"),
     "the entry points: strata.compile's Program, torch.compile's backend, @strata.kernel, and "
     "what their programs do where autograd is on"),
    ("tools", ("models.decode", "tune", "bench"),
     "built on the entry points: checking against eager, KV-cache decoding, the tuner, benchmarks"),
    ("cli", ("cli",),
     "the `strata` command over all of it"),
    ("facade", ("",), "`import strata`: the package, whose names resolve on first use"),
    ("acceptance", ("gpu_check",), "the GPU acceptance run: uses strata as its users do"),
)

# What an import inside a function may keep lazy, and why it is worth it.
HEAVY = {
    "torch": "a second or more to import; `import strata` and `strata --help` never import it",
    "numpy": "0.1 s, and with it the compiler (its arrays, dtypes): `strata --help` imports neither",
    "transformers": "seconds to import; only Hugging Face models need it",
    "rich": "only what draws a table or a spinner needs it; `strata --help` does not",
    "cuda": "cuda-bindings: only a CUDA device needs it, and it may be missing on a CPU machine",
    "pyopencl": "optional (the opencl extra): only the DSL's OpenCL path",
    "selenium": "optional (the test extra): only the browser tests of the view",
    "gguf": "only GGUF files need it",
    "safetensors": "only checkpoints need it",
    "triton": "optional: only the benchmarks' environment report names its version",
    "llama_cpp": "optional (the bench-llamacpp extra): llama.cpp's rows of the decode benchmark",
    "ray": "optional (the ray extra), seconds to import: only `strata tune --ray` needs it",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


class Import:
    """One import statement's targets: strata modules (`internal`) and other packages' modules."""

    def __init__(self, module: str, node, lazy: bool):
        self.module, self.line, self.lazy = module, node.lineno, lazy
        self.internal, self.external = set(), set()
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = module.split(".")[:None if MODULES[module].name == "__init__.py" else -1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            if name.split(".")[0] != "strata":
                self.external.add(name)
                continue
            while name not in MODULES:          # `from .ir import Loop`: the module is .ir
                name = name.rpartition(".")[0]
            if name != module:
                self.internal.add(name)

    def where(self) -> str:
        return f"{MODULES[self.module].relative_to(ROOT.parent)}:{self.line}"


def _imports() -> list[Import]:
    out = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f)}
        out += [Import(module, n, id(n) in inside) for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom))]
    return out


IMPORTS = _imports()


def _layer(module: str) -> int:
    name = module.removeprefix("strata").removeprefix(".")
    best, index = -1, None
    for i, (_, prefixes, _) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".") or p == "") and len(p) > best:
                best, index = len(p), i
    return index


def _heavy_at_import() -> dict[str, set[str]]:
    """module -> the HEAVY packages that importing it imports (module-level imports, followed, and
    the packages above it, whose __init__ runs first; but not strata's own, which runs first for
    every module alike)."""
    direct = {m: set() for m in MODULES}
    follow = {m: {m.rsplit(".", k)[0] for k in range(1, m.count("."))} for m in MODULES}
    for imp in IMPORTS:
        if not imp.lazy:
            direct[imp.module] |= {e.split(".")[0] for e in imp.external} & set(HEAVY)
            follow[imp.module] |= imp.internal
    out = {}
    for m in MODULES:
        seen, todo, heavy = {m}, [m], set()
        while todo:
            n = todo.pop()
            heavy |= direct[n]
            todo += [x for x in follow[n] if x not in seen]
            seen.update(follow[n])
        out[m] = heavy
    return out


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """Some circle of `edges` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _layer(m) is None] == []


def test_the_import_graph_has_no_circle():
    edges: dict[str, set[str]] = {}
    for imp in IMPORTS:
        edges.setdefault(imp.module, set()).update(imp.internal)
    circle = _cycle(edges)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_imports_point_down_the_layers():
    up = [f"{imp.where()}: {LAYERS[_layer(imp.module)][0]} {imp.module} imports "
          f"{LAYERS[_layer(t)][0]} {t}" for imp in IMPORTS for t in sorted(imp.internal)
          if _layer(t) > _layer(imp.module)]
    assert up == [], "imports that point up the layers:\n" + "\n".join(up)


def test_an_import_inside_a_function_keeps_something_heavy_lazy():
    heavy = _heavy_at_import()
    at_top = {(i.module, e) for i in IMPORTS if not i.lazy for e in i.external}
    bad = []
    for imp in (i for i in IMPORTS if i.lazy):
        have = heavy[imp.module]
        keeps = {e.split(".")[0] for e in imp.external if (imp.module, e) not in at_top} & set(HEAVY)
        for t in imp.internal:
            keeps |= heavy[t] - have
        if keeps:
            continue
        bad.append(f"{imp.where()}: {', '.join(sorted(imp.internal | imp.external))}")
    assert bad == [], ("imports inside functions that keep nothing heavy lazy (import them at the "
                       "top of the module):\n" + "\n".join(bad))


@pytest.mark.parametrize("code", ["import strata", "import strata.cli; strata.cli.build_parser()"])
def test_import_strata_and_the_cli_never_import_torch_or_numpy(code):
    import subprocess
    run = subprocess.run([sys.executable, "-c", f"{code}; import sys; print(sorted({{'torch', "
                          f"'numpy'}} & set(sys.modules)))"], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]", run.stderr
