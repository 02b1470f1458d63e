"""codegen/cuda_units.py and runtime/cuda_units.py: twins share one compiled function; units have a
fixed size and compile side by side; the units are the text --ir cuda prints (the end-to-end run
on a simulated driver is in test_cuda_program.py)."""
from strata.api import compile_snippet
from strata.codegen import cuda_units
from strata.codegen.cuda_units import plan_units
from strata.runtime.cuda_units import compile_units

FOUR_LAYERS = ("torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(64, 64), "
               "torch.nn.ReLU())])(torch.randn(8, 64))")


def _program(code=FOUR_LAYERS):
    program, _ = compile_snippet(code)
    return program.lowered.kernel


def test_repeated_layers_compile_two_kernels_of_four():
    kp = _program()
    units = plan_units(kp, "sm_90")
    names = [k.name for k in kp.kernels]
    assert len(names) == 4 and kp.twins            # the lowering found a twin at Tile IR
    assert units.kernels == [names[:2]]            # the first layer reads the input: its own code
    assert [units.function_of[n] for n in names] == [names[0], names[1], names[1], names[1]]
    assert units.sources[0].count("__global__") == 2


def test_different_kernels_are_not_twins():
    kp = _program("torch.softmax(torch.randn(4, 100), -1) @ torch.randn(100, 7)")
    units = plan_units(kp, "sm_90")
    assert all(units.function_of[k.name] == k.name for k in kp.kernels)


def test_units_have_a_fixed_size_and_compile_in_order_on_threads(monkeypatch):
    monkeypatch.setattr(cuda_units, "UNIT_KERNELS", 1)
    units = plan_units(_program(), "sm_90")
    assert len(units.sources) == 2

    def compile_one(source, names):
        assert source.count("__global__") == 1
        return names[0].encode()
    assert compile_units(units, compile_one, workers=2) == [n[0].encode() for n in units.kernels]
    assert compile_units(units, compile_one, workers=1) == [n[0].encode() for n in units.kernels]


def test_an_empty_program_has_no_units():
    kp = _program("torch.randn(0, 4) + 1")
    units = plan_units(kp, "sm_90")
    assert units.sources == [] and compile_units(units, lambda s, n: b"") == []
