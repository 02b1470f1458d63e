"""What a new user types first (issue 11): 0-d results, empty tensors, in-place snippets, a
reference that must not fail where eager does not, capture that never computes, data-dependent
shapes, and the verdict comparing shape and dtype as well as values."""
import sys

import pytest
import torch
import torch.nn.functional as F

import strata
from strata.bench import check
from strata.cli import main
from conftest import run_and_compare


# ---------------------------------------------------------------- 0-d results

ZERO_D = {
    "sum": (lambda x: x.sum(), (5, 3)),
    "mean": (lambda x: x.mean(), (5, 3)),
    "amax": (lambda x: x.amax(), (5, 3)),
    "argmax": (lambda x: x.argmax(), (5, 3)),
    "var": (lambda x: x.var(), (5, 3)),
    "std": (lambda x: x.std(), (7,)),
    "dot": (lambda x: torch.matmul(x, x), (7,)),
    "einsum": (lambda x: torch.einsum("i->", x), (7,)),
    "0-d input": (lambda x: x * 2 + 1, ()),
}


@pytest.mark.parametrize("name", ZERO_D)
def test_zero_d_results_keep_eager_shape(name):
    fn, shape = ZERO_D[name]
    x = torch.randn(shape)
    got = strata.compile(fn, (x,))(x)
    assert got.shape == fn(x).shape == torch.Size([])
    run_and_compare(fn, (x,))


def test_zero_d_through_torch_compile():
    x = torch.randn(5, 3)
    got = torch.compile(lambda t: t.sum() * 2, backend="strata")(x)
    assert got.shape == torch.Size([]) and torch.allclose(got, x.sum() * 2)


def test_verdict_compares_shape_and_dtype(monkeypatch):
    """A program whose values are right but whose shape or dtype is not must FAIL."""
    x = torch.randn(5, 3)
    prog = strata.compile(lambda t: t.sum(), (x,))
    assert check.verify(prog, lambda t: t.sum(), [x]).passed
    real = strata.Program.run_flat
    monkeypatch.setattr(strata.Program, "run_flat", lambda self, i: [o.reshape(1) for o in real(self, i)])
    bad = check.verify(prog, lambda t: t.sum(), [x])
    assert not bad.passed and "eager gives ()" in bad.outputs[0].problem
    monkeypatch.setattr(strata.Program, "run_flat", lambda self, i: [o.double() for o in real(self, i)])
    assert not check.verify(prog, lambda t: t.sum(), [x]).passed


# ---------------------------------------------------------------- empty tensors

EMPTY = {
    "add": (lambda x: x + 1, [(0, 4)]),
    "sum over the empty axis": (lambda x: x.sum(0), [(0, 5)]),
    "mean over the empty axis (NaN)": (lambda x: x.mean(0), [(0, 5)]),
    "prod over the empty axis": (lambda x: x.prod(0), [(0, 5)]),
    "sum along a kept empty axis": (lambda x: x.sum(1), [(0, 5)]),
    "mm with M = 0": (torch.mm, [(0, 5), (5, 3)]),
    "mm with K = 0 (zeros)": (torch.mm, [(3, 0), (0, 4)]),
    "linear on (0, 3)": (lambda x, w: F.linear(x, w), [(0, 3), (4, 3)]),
    "softmax": (lambda x: x.softmax(0), [(0, 5)]),
    "cat with an empty part": (lambda a, b: torch.cat([a, b]), [(0, 3), (2, 3)]),
    "empty and non-empty outputs": (lambda x: (x + 1, x.sum(0)), [(0, 5)]),
}


@pytest.mark.parametrize("name", EMPTY)
def test_empty_tensors_match_eager(name):
    fn, shapes = EMPTY[name]
    prog = run_and_compare(fn, tuple(torch.randn(s) for s in shapes))
    out_shapes = [b.shape for b in prog.lowered.kernel.buffers if b.kind == "output"]
    if all(0 in s for s in out_shapes):
        assert prog.kernels == [], "an empty output launches nothing"


def test_amax_over_an_empty_axis_is_an_error_as_in_eager(capsys):
    assert main(["run", "-c", "torch.randn(0, 5).amax(0)"]) == 1
    err = capsys.readouterr().err
    assert "zero-size" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("code", ["torch.randn(0,4)+1", "torch.randn(0,5).sum(0)",
                                  "torch.mm(torch.randn(0,5), torch.randn(5,3))"])
def test_empty_snippets_pass(code, capsys):
    assert main(["run", "-c", code, "--device", "sim"]) == 0, capsys.readouterr()
    assert "PASS" in capsys.readouterr().out


# ---------------------------------------------------------------- in place

def test_in_place_snippet_passes(capsys):
    assert main(["run", "-c", "torch.randn(4).add_(1)"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "x (updated in place)" in out


def test_in_place_returns_the_mutated_input_like_eager():
    x = torch.randn(4)
    prog = strata.compile(lambda t: t.add_(1), (x.clone(),))
    before = x.clone()
    out = prog(x)
    assert out is x and torch.equal(x, before + 1)


def test_verdict_checks_the_input_updated_in_place(monkeypatch):
    """An in-place program whose return value is right but whose input update is wrong FAILs."""
    fn = lambda t: t.mul_(2)       # noqa: E731
    prog = strata.compile(fn, (torch.randn(4),))
    assert check.verify(prog, fn, [torch.randn(4)]).passed
    real = strata.Program.run_flat

    def forgets_the_update(self, inputs):
        saved = [t.clone() for t in inputs]
        out = [o.clone() for o in real(self, inputs)]
        for t, s in zip(inputs, saved):
            t.copy_(s)
        return out
    monkeypatch.setattr(strata.Program, "run_flat", forgets_the_update)
    report = check.verify(prog, fn, [torch.randn(4)])
    assert not report.passed and any("updated in place" in o.name and not o.passed for o in report.outputs)


def test_in_place_snippet_through_the_capture_cache(capsys):
    """The second run reads the Torch IR back: the in-place update must survive the cache."""
    for _ in range(2):
        assert main(["run", "-c", "torch.randn(6).mul_(3)"]) == 0
        assert "x (updated in place)" in capsys.readouterr().out


# ---------------------------------------------------------------- the reference

def test_reference_follows_casts_written_in_the_program(capsys):
    code = "torch.nn.Linear(256, 512)(torch.randn(4, 64, 256).to(torch.bfloat16).float())"
    assert main(["run", "-c", code, "--device", "sim"]) == 0
    captured = capsys.readouterr()
    assert "PASS" in captured.out and "internal error" not in captured.err


def test_reference_is_float64_and_rounds_where_the_program_does():
    x = torch.randn(64)
    ref = check.eager_reference(lambda t: (t * 3).to(torch.bfloat16).float() / 3, (x,))[0]
    want = ((x.double() * 3).to(torch.bfloat16).double() / 3).numpy()
    assert ref.dtype.name == "float64" and (ref == want).all()


# ---------------------------------------------------------------- capture never computes

def test_compile_never_runs_the_snippet_on_its_inputs():
    """Capture works on fake tensors: an in-place snippet leaves its example input untouched
    (before, parse_snippet evaluated the program eagerly, at full size)."""
    from strata.api import compile_snippet
    _, snippet = compile_snippet("torch.randn(4).add_(1)", until="loop")
    torch.manual_seed(0)
    assert torch.equal(snippet.example_inputs[0], torch.randn(4))


def test_big_bf16_matmul_compiles_from_shapes(monkeypatch):
    """The 4096^3 bf16 matmul of the issue: no real matmul may run while compiling."""
    from strata.api import compile_snippet
    calls = []
    real = torch.Tensor.__matmul__

    def spy(a, b):
        if not isinstance(a, torch._subclasses.FakeTensor):
            calls.append(a.shape)
        return real(a, b)
    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    monkeypatch.setenv("STRATA_NO_CACHE", "1")
    program, _ = compile_snippet("torch.randn(4096, 4096, dtype=torch.bfloat16) @ "
                                 "torch.randn(4096, 4096, dtype=torch.bfloat16)", until="tile")
    assert calls == [] and "matmul" in program.ir("tile")


# ---------------------------------------------------------------- other bad input

@pytest.mark.parametrize("argv, says", [
    (["run", "-c", "torch.randn(4,5)[torch.randn(4,5) > 0]"], "depends on the data"),
    (["run", "-c", "torch.randn(4).sum().item()"], "depends on the data"),
    (["run", "-c", "1 + 2"], "computes no tensor"),
    (["compile", "-c", "torch.randn(3) + 1", "-o", "/nonexistent/dir/k.cu"], "cannot write"),
    (["compile", "-c", "torch.randn(3) + 1", "--target", "sm_999"], "unknown target"),
    (["compile", "-c", "torch.randn(3) + 1", "--target", "hopper"], "unknown target"),
    (["run", "-c", "torch.randn(3) + torch.randn(4)"], "failed to evaluate"),
])
def test_bad_input_is_one_sentence(argv, says, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert "internal error" not in err and "Traceback" not in err


def test_data_dependent_shape_in_python_is_one_sentence():
    with pytest.raises(strata.StrataError, match="depends on the data"):
        strata.compile(lambda x: x[x > 0], (torch.randn(4, 5),))


def test_python_numbers_among_example_inputs_are_constants():
    fn = lambda x, n, s: x * n + s     # noqa: E731
    x = torch.randn(3)
    prog = strata.compile(fn, (x, 3, 0.5))
    assert torch.allclose(prog(x, 3, 0.5), fn(x, 3, 0.5))
    with pytest.raises(strata.StrataError, match="compiled"):
        prog(x, 4, 0.5)


@pytest.mark.parametrize("code", ["torch.topk(torch.randn(4, 5), 2)", "torch.randn(4, 5).max(dim=1)"])
def test_structured_outputs_are_cached_silently(code, capsys):
    for _ in range(2):
        main(["compile", "-c", code, "--ir", "torch"])
        assert "capture cache" not in capsys.readouterr().err


# ---------------------------------------------------------------- logs and output

def test_verbose_logs_go_to_stderr(capsys):
    assert main(["compile", "-c", "torch.randn(8) * 2", "--ir", "cuda", "-v"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("// strata:") and "emit -> cuda" in err and "emit -> cuda" not in out


def test_vv_prints_only_passes_that_changed(capsys):
    code = "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))"
    assert main(["compile", "-c", code, "--ir", "tile", "-vv"]) == 0
    err = capsys.readouterr().err
    blocks = err.split(">>> ")[1:]
    assert blocks and all("\n+" in b or "\n-" in b for b in blocks)
    assert "tile passes changed nothing" in err


def test_help_and_version_do_not_import_torch():
    import subprocess
    probe = ("import sys\nfrom strata.cli import main\n"
             "try:\n    main([%r])\nexcept SystemExit:\n    pass\n"
             "print('TORCH', 'torch' in sys.modules)")
    for flag in ("--help", "--version"):
        out = subprocess.run([sys.executable, "-c", probe % flag], capture_output=True, text=True,
                             check=True).stdout
        assert "TORCH False" in out, out
    assert strata.__version__ in subprocess.run([sys.executable, "-m", "strata.cli", "--version"],
                                                capture_output=True, text=True).stdout


def test_every_option_has_help():
    from strata.cli import build_parser
    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sub in subs.choices.items():
        for action in sub._actions:
            assert action.help, f"strata {name} {action.option_strings or action.dest} has no help"
