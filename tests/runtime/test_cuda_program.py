"""The CUDA runtime (strata/runtime/program.py).

On any machine: CudaProgram runs against `SimDriver`, a stand-in for runtime/driver.py whose
"device memory" is CPU tensors and whose launch reads kernelParams exactly as cuLaunchKernel does
(a void*[] of pointers to 64-bit addresses) and runs the kernel in the simulator on the memory at
those addresses. That checks everything but the driver calls themselves: argument packing and
order, temps at their slab offsets, outputs, weights, copies of odd arguments, output structure.

On a machine with a CUDA GPU (skipped elsewhere): strata.compile(..., device="cuda") on spine
programs, compared with eager, with CUDA-graph replay, plain launches, non-contiguous and
misaligned inputs, rejected arguments, kernel rows, timings and a failing launch's message.
"""
import ctypes

import numpy as np
import pytest
import torch

import strata
from strata.bench import check
from strata.core import dtypes
from strata.api import compile_snippet, to_numpy
from strata.core.errors import DeviceUnavailable, InputMismatch
from strata.kernel_ir.sim import run_kernel
from strata.kernel_ir.sim_memory import storage_numpy
from strata.runtime import program as runtime_program
from strata.runtime.program import CudaProgram
from strata.codegen.cfamily import cname

from fake_cuda import LauncherCalls, counts

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")

CHAIN2 = ("torch.log_softmax(torch.softmax(torch.randn(8, 64), -1) @ torch.randn(64, 32), -1) "
          "@ torch.randn(32, 16)")


# ---------------------------------------------------------------- CPU: a simulated driver

class SimDriver(LauncherCalls):
    """runtime/driver.py's interface over CPU memory; launches (through the C launcher and
    fake_libcuda.c) run in the simulator."""

    def __init__(self, program):
        self.kernels = {cname(k.name): k for k in program.kernels}
        self.images, self.launched, self.errors = [], [], []

    def context(self, device):
        return "ctx"

    def make_current(self, ctx):
        assert ctx == "ctx"

    def arch(self, device):
        return "sm_90"

    def current_stream(self, device):
        return 7

    def load_module(self, image, what=""):
        self.images.append(image)
        return "module"

    def get_function(self, module, name):
        assert module == "module" and name in self.kernels
        return ("function", name)

    def function_attribute(self, function, attribute, kernel=""):
        return {"NUM_REGS": 32, "LOCAL_SIZE_BYTES": 0}[attribute]

    def launch(self, function, kernel, grid, block, params_address, stream, smem_bytes=0):
        # the function's kernel: a twin launches its first twin's code on its own arguments
        assert function[0] == "function"
        k = self.kernels[function[1]]
        assert (grid, block) == (self.kernels[kernel].grid, self.kernels[kernel].block)
        assert stream == 7 and smem_bytes == 0
        slots = (ctypes.c_uint64 * len(k.params)).from_address(params_address)
        memory = {}
        for p, slot in zip(k.params, slots):
            address = ctypes.c_uint64.from_address(slot).value
            nbytes = p.numel * dtypes.ITEMSIZE[p.dtype]
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
            memory[p.name] = raw.view(storage_numpy(p.dtype))
        run_kernel(k, memory)
        self.launched.append(kernel)


@pytest.fixture
def no_nvrtc(monkeypatch):
    monkeypatch.setattr(runtime_program, "compile_cubin", lambda source, arch, names: b"cubin")


def _on_sim_driver(code, **kw):
    program, snippet = compile_snippet(code)
    kp, tp = program.lowered.kernel, program.torch_program
    driver = SimDriver(kp)
    rt = CudaProgram(kp, inputs=tp.inputs, weights=tp.weights, device="cpu", driver=driver,
                     poison=True, units=program.lowered.units, **kw)
    return program, snippet, rt, driver


def _functions(rt, program):
    """The function each kernel launches (a twin launches its first twin's code)."""
    return [rt.units.function_of[cname(k.name)] for k in program.lowered.kernel.kernels]


TWINS = ("torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(64, 64), "
         "torch.nn.ReLU())])(torch.randn(8, 64))")

SIM_DRIVER_CASES = [
    "torch.nn.RMSNorm(256)(torch.randn(4, 256))",
    "torch.softmax(torch.randn(4, 1000), dim=-1)",
    CHAIN2,
    "torch.nn.LayerNorm(64)(torch.randn(8,64) @ torch.randn(64,64)) @ torch.randn(64,32)",
    ("torch.softmax(torch.randn(8,64,dtype=torch.bfloat16) @ torch.randn(64,64,dtype=torch.bfloat16), "
     "-1) @ torch.randn(64,16,dtype=torch.bfloat16)"),
    ("torch.softmax(torch.embedding(torch.randn(100,16), torch.randn(8,64).argmax(-1)), -1) "
     "@ torch.randn(16,8)"),
    "torch.relu(torch.matmul(torch.randn(16,64) + torch.randn(64), torch.randn(64,16)))",
    "torch.randn(5, 3).sum()",                   # a 0-d output
    "torch.randn(0, 4) + 1",                     # nothing to launch
    TWINS,                                       # twins launch one function
    "(torch.randn(0, 5) + 1, torch.randn(0, 5).sum(0))",
]


@pytest.mark.parametrize("code", SIM_DRIVER_CASES)
def test_runtime_on_a_simulated_driver_matches_the_simulator(code, no_nvrtc):
    program, snippet, rt, driver = _on_sim_driver(code)
    inputs = snippet.example_inputs
    pristine = [x.clone() for x in inputs]
    want = program.run_numpy(pristine)
    ref = check.eager_reference(snippet.module, pristine)
    got = rt.run(inputs)
    assert all(torch.equal(x, p) for x, p in zip(inputs, pristine))    # inputs are read-only
    assert driver.launched == _functions(rt, program)
    kp = program.lowered.kernel
    for name, g, w in zip(kp.outputs, got, want):
        b = kp.buffer(name)
        assert g.dtype == dtypes.to_torch(b.dtype) and tuple(g.shape) == tuple(b.shape)
        np.testing.assert_array_equal(to_numpy(g), w)     # bit for bit: same kernels, same memory
    has_mm = "@" in code or "matmul" in code
    for name, g, r in zip(kp.outputs, got, ref):
        dt = kp.buffer(name).dtype
        assert check.compare(name, dt, to_numpy(g), r, check.tolerance(dt, has_mm)).passed


def test_temps_share_one_slab(no_nvrtc):
    _, snippet, rt, _ = _on_sim_driver(CHAIN2)
    assert len(rt.plan.slots) == 5 and rt.plan.total_bytes < rt.plan.unshared_bytes
    rt.run(snippet.example_inputs)


def test_odd_arguments_are_copied_and_results_stay_right(no_nvrtc):
    code = "torch.nn.RMSNorm(256)(torch.randn(4, 256))"
    program, snippet, rt, _ = _on_sim_driver(code)
    x = snippet.example_inputs[0]
    transposed = x.t().contiguous().t()                          # same values, strides (1, 4)
    shifted = torch.cat([torch.zeros(1), x.reshape(-1)])[1:].view(4, 256)   # 4 bytes off
    want = program.run_numpy([x])[0]
    for arg in (transposed, shifted):
        np.testing.assert_array_equal(rt.run([arg])[0].numpy(), want)


def test_new_weights_are_taken_by_the_next_call(no_nvrtc):
    """set_weights (a torch.compile'd module's parameters changed, Program.set_weights)."""
    program, snippet, rt, _ = _on_sim_driver("torch.nn.Linear(64, 16)(torch.randn(8, 64))")
    x = snippet.example_inputs[0]
    before = rt.run([x])[0]
    new = {k: torch.randn_like(v) for k, v in program.torch_program.weights.items()}
    rt.set_weights(new)
    program.set_weights(new)            # the simulated program, the reference, reads them too
    after = rt.run([x])[0]
    np.testing.assert_array_equal(after.numpy(), program.run_numpy([x])[0])
    assert not torch.equal(before, after)


def test_each_call_gets_fresh_outputs(no_nvrtc):
    _, _, rt, _ = _on_sim_driver("torch.softmax(torch.randn(4, 1000), dim=-1)")
    a = rt.run([torch.randn(4, 1000)])[0]
    a_copy = a.clone()
    b = rt.run([torch.randn(4, 1000)])[0]
    assert a.data_ptr() != b.data_ptr() and torch.equal(a, a_copy) and not torch.equal(a, b)


def test_later_calls_launch_one_graph_updating_only_what_changed(no_nvrtc):
    """The first call launches plainly, the second builds the graph, and a later one updates the
    kernel nodes whose pointers changed (here: those reading the input, or writing the output)
    and nothing else; every call's numbers are the simulator's."""
    program, snippet, rt, driver = _on_sim_driver(TWINS)
    kernels = program.lowered.kernel.kernels
    touching = lambda *names: sum(any(p.name in names for p in k.params) for k in kernels)
    assert len(kernels) == 4 and touching(*rt.spec, *program.lowered.kernel.outputs) == 2
    xs = [torch.randn(8, 64) for _ in range(4)]
    before = counts()
    got = [rt.run([xs[0]])[0], rt.run([xs[1]])[0]]
    after = counts()
    assert after["launches"] - before["launches"] == len(kernels)
    assert (after["graphs"] - before["graphs"], after["graph_launches"] - before["graph_launches"],
            after["node_updates"] - before["node_updates"]) == (1, 1, 0)
    assert rt._launcher.has_graph
    # sm_90: the kernels are joined by programmatic edges (each waits for the one before itself)
    assert rt.programmatic and after["programmatic_edges"] - before["programmatic_edges"] == 3
    out = torch.empty_like(got[0])
    got.append(rt.run([xs[2]], out=[out])[0])           # new input and output pointers
    middle = counts()
    assert middle["node_updates"] - after["node_updates"] == touching(*rt.spec, *program.lowered.kernel.outputs)
    got.append(rt.run([xs[2]], out=[out])[0])           # the same pointers: nothing to update
    assert counts()["node_updates"] == middle["node_updates"]
    assert got[2] is out and driver.errors == []
    for x, g in zip([*xs[:3], xs[2]], got):
        np.testing.assert_array_equal(g.numpy(), program.run_numpy([x])[0])


def test_without_programmatic_launch_the_graph_has_full_edges(no_nvrtc, monkeypatch):
    monkeypatch.setenv("STRATA_PDL", "0")
    program, snippet, rt, driver = _on_sim_driver(TWINS)
    before = counts()
    for _ in range(2):
        got = rt.run(snippet.example_inputs)[0]
    after = counts()
    assert not rt.programmatic and after["graphs"] - before["graphs"] == 1
    assert after["programmatic_edges"] == before["programmatic_edges"] and driver.errors == []
    np.testing.assert_array_equal(got.numpy(), program.run_numpy(snippet.example_inputs)[0])


def test_a_program_of_many_waves_keeps_full_edges_unless_pinned(no_nvrtc, monkeypatch):
    """Programmatic edges by default only where every kernel is at most two blocks per SM (a
    decode step); a prefill's many-wave kernels lost with them on the H200. STRATA_PDL=1 pins."""
    code = "torch.relu(torch.randn(1200, 1024)) * 2"
    program, snippet, rt, driver = _on_sim_driver(code)
    assert max(k.grid for k in program.lowered.kernel.kernels) > 2 * 132
    assert not rt.programmatic
    monkeypatch.setenv("STRATA_PDL", "1")
    assert _on_sim_driver(code)[2].programmatic


def test_every_kernel_waits_for_the_one_before_it():
    """What makes programmatic edges safe: each CUDA kernel's first statement waits for its
    predecessor (griddepcontrol.wait, sm_90+ only), in the PTX NVRTC makes for sm_90."""
    from strata.runtime import nvrtc
    program, _ = compile_snippet(CHAIN2)
    source = program.source("cuda")
    assert source.count("st_grid_dependency();") == len(program.kernels)
    for k in program.kernels:
        body = source.split(f"{cname(k.name)}(", 1)[1].split("{", 1)[1]
        before = body.split("st_grid_dependency();")[0].strip().splitlines()
        assert all(ln.strip().startswith(("__shared__", "extern __shared__", "unsigned char* "
                                          "st_dyn_smem")) for ln in before)    # declarations only
    ptx = nvrtc.compile_cuda(source, "sm_90", want="ptx").decode()
    assert ptx.count("griddepcontrol.wait") == len(program.kernels)
    assert "griddepcontrol" not in nvrtc.compile_cuda(source, "sm_80", want="ptx").decode()


def test_a_failing_launch_names_its_kernel(no_nvrtc):
    from fake_cuda import fake_libcuda
    program, snippet, rt, driver = _on_sim_driver(CHAIN2)
    second = rt.launches[1]
    fake_libcuda()[1].fake_fail(ctypes.c_void_p(driver.handle(second.function)))
    try:
        with pytest.raises(strata.core.errors.CudaError, match=rf"cuLaunchKernel failed with "
                           rf"CUDA_ERROR_ILLEGAL_ADDRESS launching {second.kernel.name} \(grid"):
            rt.run(snippet.example_inputs)
        rt.run(snippet.example_inputs)                  # a graph call fails too, and says so
    except strata.core.errors.CudaError as e:
        assert str(e).startswith("a CUDA graph call failed with CUDA_ERROR_ILLEGAL_ADDRESS")
    finally:
        fake_libcuda()[1].fake_fail(None)


def test_out_must_match_the_outputs(no_nvrtc):
    _, snippet, rt, _ = _on_sim_driver("torch.softmax(torch.randn(4, 1000), dim=-1)")
    with pytest.raises(InputMismatch, match=r"has shape \(4, 999\), but"):
        rt.run(snippet.example_inputs, out=[torch.empty(4, 999)])
    with pytest.raises(InputMismatch, match="contiguous"):
        rt.run(snippet.example_inputs, out=[torch.empty(1000, 4).t()])


def test_outputs_that_are_inputs_and_tuples(no_nvrtc):
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(64)

        def forward(self, x, r):
            h = x + r
            return self.norm(h), h, x

    inputs = (torch.randn(4, 64), torch.randn(4, 64))
    prog = strata.compile(Residual(), inputs)
    kp, tp = prog.lowered.kernel, prog.torch_program
    rt = CudaProgram(kp, inputs=tp.inputs, weights=tp.weights, device="cpu", driver=SimDriver(kp))
    out = tp.unflatten(rt.run(inputs))
    want = prog(*inputs)
    assert isinstance(out, tuple) and len(out) == 3
    for o, w in zip(out, want):
        torch.testing.assert_close(o, w, rtol=0, atol=0)
    assert out[2].data_ptr() != inputs[0].data_ptr()            # a copy, not the caller's tensor


def test_an_input_returned_as_it_was_before_its_update_in_place(no_nvrtc):
    """`b = g.clone(); g.mul_(3); return b, g`: b is a buffer of its own, written before the
    update (loop/scatter.py `snapshots`); the caller's tensor is updated."""
    def f(g):
        b = g.clone()
        g.mul_(3)
        return b, g

    x = torch.arange(1.0, 7.0).reshape(2, 3)
    prog = strata.compile(f, (x.clone(),))
    kp, tp = prog.lowered.kernel, prog.torch_program
    rt = CudaProgram(kp, inputs=tp.inputs, weights=tp.weights, device="cpu", driver=SimDriver(kp),
                     poison=True)
    given = x.clone()
    b, g = tp.unflatten(rt.run([given]))
    assert torch.equal(b, x) and torch.equal(g, x * 3) and torch.equal(given, x * 3)
    assert b.data_ptr() != given.data_ptr()


def test_wrong_arguments_are_one_sentence(no_nvrtc):
    _, _, rt, _ = _on_sim_driver("torch.softmax(torch.randn(4, 1000), dim=-1)")
    with pytest.raises(InputMismatch, match=r"input 'x' has shape \(4, 999\), but"):
        rt.run([torch.randn(4, 999)])
    with pytest.raises(InputMismatch, match="input 'x' is on meta but the program runs on cpu"):
        rt.run([torch.randn(4, 1000, device="meta")])


def test_kernel_rows(no_nvrtc):
    program, _, rt, _ = _on_sim_driver(CHAIN2)
    rows = rt.kernel_rows()
    assert [r["name"] for r in rows] == [k.name for k in program.kernels]
    for r, k in zip(rows, program.kernels):
        assert (r["grid"], r["block"], r["smem_bytes"], r["registers"]) == (k.grid, k.block,
                                                                           k.smem_bytes, 32)


def test_the_cubin_comes_from_the_compile_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    _, _, rt, driver = _on_sim_driver("torch.softmax(torch.randn(4, 1000), dim=-1)")
    assert driver.images[0][:4] == b"\x7fELF"                    # a cubin for sm_90
    assert "k_softmax_reduce" in rt.units.sources[0]
    assert any(tmp_path.rglob("*.cubin"))


def test_twins_compile_once_in_units_of_their_own(monkeypatch, tmp_path):
    """Units of one kernel each (UNIT_KERNELS=1), compiled by NVRTC on two threads: four
    launches, two cubins, and the answer of the simulator."""
    from strata.codegen import cuda_units
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda_units, "UNIT_KERNELS", 1)
    program, snippet, rt, driver = _on_sim_driver(TWINS)
    assert len(program.lowered.kernel.kernels) == 4
    # one emission: the units compiled are the text --ir cuda prints, one after the other
    assert len(rt.units.sources) == 2 and "".join(rt.units.sources) == program.source("cuda")
    assert len(driver.images) == 2 and all(i[:4] == b"\x7fELF" for i in driver.images)
    got = rt.run(snippet.example_inputs)[0]
    np.testing.assert_array_equal(to_numpy(got), program.run_numpy(snippet.example_inputs)[0])
    assert driver.launched == _functions(rt, program)


def test_check_and_report_of_a_cuda_program(no_nvrtc, capsys):
    """What `strata run --device cuda` does after compiling, on the simulated driver."""
    program, snippet, rt, driver = _on_sim_driver(CHAIN2)
    program.device, program._runtime = "cuda", rt
    rt.poison = False
    report = check.compare_with_eager(program, snippet)
    assert report.passed and rt.poison is False              # poisoned for the check only
    assert len(driver.launched) == len(program.kernels)
    check.print_report(program, report)
    out = capsys.readouterr().out
    assert "kernels launched (CUDA, cpu, sm_90)" in out and "registers" in out and "PASS" in out


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU")
def test_compile_for_cuda_without_a_gpu_is_one_sentence():
    with pytest.raises(DeviceUnavailable) as e:
        strata.compile(torch.nn.RMSNorm(64), (torch.randn(2, 64),), device="cuda")
    assert str(e.value) == ("--device cuda needs an NVIDIA GPU visible to torch; none is; "
                            "use --device sim")
    assert e.value.exit_code == 2


# ---------------------------------------------------------------- GPU: the real thing

class AddMatmulRelu(torch.nn.Module):
    def forward(self, x, b, w):
        return torch.relu(torch.matmul(x + b, w))


class Residual(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.norm = torch.nn.RMSNorm(n)

    def forward(self, x, r):
        h = x + r
        return self.norm(h), h


class SoftmaxChain(torch.nn.Module):
    def forward(self, x, w1, w2):
        return torch.softmax(torch.softmax(x, -1) @ w1, -1) @ w2


def _bf16(m):
    return m.to(torch.bfloat16)


GPU_CASES = {
    # name: (module factory, input factory, has a contraction)
    "rmsnorm_f32": (lambda: torch.nn.RMSNorm(2048), lambda: (torch.randn(1, 32, 2048),), False),
    "rmsnorm_bf16": (lambda: _bf16(torch.nn.RMSNorm(2048)),
                     lambda: (torch.randn(1, 32, 2048).bfloat16(),), False),
    "softmax_f32": (lambda: torch.nn.Softmax(-1), lambda: (torch.randn(4, 1000),), False),
    "softmax_bf16": (lambda: torch.nn.Softmax(-1), lambda: (torch.randn(8, 4096).bfloat16(),), False),
    "layernorm_f32": (lambda: torch.nn.LayerNorm(1024), lambda: (torch.randn(16, 1024),), False),
    "layernorm_bf16": (lambda: _bf16(torch.nn.LayerNorm(1024)),
                       lambda: (torch.randn(16, 1024).bfloat16(),), False),
    "add_matmul_relu": (AddMatmulRelu, lambda: (torch.randn(16, 64), torch.randn(64),
                                                torch.randn(64, 16)), True),
    "residual_rmsnorm": (lambda: Residual(512), lambda: (torch.randn(8, 512), torch.randn(8, 512)),
                         False),
    "softmax_chain_temps": (SoftmaxChain, lambda: (torch.randn(8, 64), torch.randn(64, 32),
                                                   torch.randn(32, 16)), True),
    "gelu_f16_tail": (lambda: torch.nn.GELU(), lambda: (torch.randn((1 << 20) + 3).half(),), False),
}


def _check_against_eager(module, cpu_inputs, out, has_mm, label="", on_gpu=True):
    ref = check.eager_reference(module, cpu_inputs)
    with torch.no_grad():
        eager = module(*cpu_inputs)
    flat_out, spec_out = torch.utils._pytree.tree_flatten(out)
    flat_eager, spec_eager = torch.utils._pytree.tree_flatten(eager)
    assert spec_out == spec_eager, label
    assert len(flat_out) == len(ref)
    for i, (g, e, r) in enumerate(zip(flat_out, flat_eager, ref)):
        assert g.is_cuda == on_gpu, label
        assert g.dtype == e.dtype and g.shape == e.shape, f"{label} output {i}"
        dt = dtypes.from_torch(g.dtype)
        res = check.compare(f"out{i}", dt, to_numpy(g), r, check.tolerance(dt, has_mm))
        assert res.passed, f"{label} output {i}: rel {res.rel:.3g}, max abs {res.max_abs:.3g}"


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_cases_pass_on_the_simulator(name):
    """The GPU cases' own expectations (output structure, dtypes, tolerances) hold for the same
    kernels run by the simulator, so a GPU failure below points at the runtime or the GPU."""
    make, make_inputs, has_mm = GPU_CASES[name]
    module, cpu_inputs = make(), make_inputs()
    prog = strata.compile(module, cpu_inputs, device="sim")
    _check_against_eager(module, cpu_inputs, prog(*cpu_inputs), has_mm, name, on_gpu=False)


@gpu
@pytest.mark.parametrize("name", sorted(GPU_CASES))
@pytest.mark.parametrize("use_graph", [True, False], ids=["graph", "plain"])
def test_gpu_matches_eager_over_repeated_calls(name, use_graph):
    make, make_inputs, has_mm = GPU_CASES[name]
    module = make()
    prog = strata.compile(module, make_inputs(), device="cuda", use_graph=use_graph)
    results = []
    for call in range(4):                       # call 1 plain, 2 captures, 3 and 4 replay
        cpu_inputs = make_inputs()
        out = prog(*[x.cuda() for x in cpu_inputs])
        torch.cuda.synchronize()
        _check_against_eager(module, cpu_inputs, out, has_mm, f"{name} call {call}")
        results.append((cpu_inputs, out))
    assert prog.runtime._launcher.has_graph == use_graph
    # earlier results are not overwritten by later calls (graph outputs are copied out)
    cpu_inputs, out = results[1]
    _check_against_eager(module, cpu_inputs, out, has_mm, f"{name} call 1, read again")


@gpu
def test_gpu_non_contiguous_and_misaligned_inputs():
    module = torch.nn.RMSNorm(2048)
    prog = strata.compile(module, (torch.randn(32, 2048),), device="cuda")
    x = torch.randn(32, 2048)
    transposed = x.t().contiguous().cuda().t()
    assert not transposed.is_contiguous()
    shifted = torch.cat([torch.zeros(1), x.reshape(-1)]).cuda()[1:].view(32, 2048)
    assert shifted.data_ptr() % 16
    for call in range(3):
        for arg in (transposed, shifted):
            out = prog(arg)
            torch.cuda.synchronize()
            _check_against_eager(module, (x,), out, False, f"call {call}")


@gpu
def test_gpu_rejects_cpu_tensors_and_wrong_dtypes():
    prog = strata.compile(torch.nn.Softmax(-1), (torch.randn(4, 1000),), device="cuda")
    with pytest.raises(InputMismatch, match=r"input '\w+' is on cpu but the program runs on cuda"):
        prog(torch.randn(4, 1000))
    with pytest.raises(InputMismatch, match=r"input '\w+' is float16, but the program was compiled for float32"):
        prog(torch.randn(4, 1000, device="cuda").half())


@gpu
def test_gpu_poisoned_outputs_are_all_written():
    module = SoftmaxChain()
    inputs = (torch.randn(8, 64), torch.randn(64, 32), torch.randn(32, 16))
    prog = strata.compile(module, inputs, device="cuda")
    rt = CudaProgram(prog.lowered.kernel, inputs=prog.torch_program.inputs,
                     weights=prog.torch_program.weights, poison=True)
    for _ in range(3):
        out = rt.run([x.cuda() for x in inputs])
        torch.cuda.synchronize()
        assert not torch.isnan(out[0]).any()
        _check_against_eager(module, inputs, out[0], True)


@gpu
def test_gpu_kernel_rows_and_timings():
    prog = strata.compile(SoftmaxChain(), (torch.randn(8, 64), torch.randn(64, 32),
                                           torch.randn(32, 16)), device="cuda")
    rows = prog.runtime.kernel_rows()
    assert [r["name"] for r in rows] == [k.name for k in prog.kernels]
    assert all(isinstance(r["registers"], int) and r["registers"] > 0 for r in rows)
    major, minor = torch.cuda.get_device_capability()
    assert prog.runtime.arch == f"sm_{major}{minor}"
    times = prog.runtime.time_kernels([torch.randn(8, 64, device="cuda"),
                                       torch.randn(64, 32, device="cuda"),
                                       torch.randn(32, 16, device="cuda")], warmup=1, reps=3)
    assert [t["name"] for t in times] == [k.name for k in prog.kernels]
    assert all(t["ms"] > 0 for t in times)


@gpu
def test_gpu_failing_launch_names_kernel_grid_and_block():
    from strata.core.errors import CudaError
    from strata.runtime import driver
    from strata.runtime.launch import PackedArgs
    prog = strata.compile(torch.nn.Softmax(-1), (torch.randn(4, 1000),), device="cuda")
    lc = prog.runtime.launches[0]
    x = torch.randn(4, 1000, device="cuda")
    y = torch.empty_like(x)
    args = PackedArgs([x.data_ptr()] * (len(lc.kernel.params) - 1) + [y.data_ptr()])
    with pytest.raises(CudaError) as e:       # 4096 threads per block: refused before it runs
        driver.launch(lc.function, lc.name, 4, 4096, args.address,
                      torch.cuda.current_stream().cuda_stream)
    msg = str(e.value)
    assert msg.startswith("cuLaunchKernel failed with CUDA_ERROR_") and "\n" not in msg
    assert msg.endswith(f"launching {lc.name} (grid 4, block 4096)")
    # a refused launch leaves the context usable: a correct call works afterwards
    out = prog(x)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", ["sim", "cpu"])
def test_program_writes_into_out(device):
    """Program(..., out=): the results land in the caller's tensors (on "cuda" the kernels write
    them; elsewhere they are copied in), with the checks of an input."""
    norm = torch.nn.RMSNorm(64)
    x = torch.randn(3, 64)
    with torch.no_grad():
        prog = strata.compile(norm, (x,), device=device)
        out = torch.empty(3, 64)
        assert prog(x, out=out) is out
        torch.testing.assert_close(out, norm(x), rtol=1e-5, atol=1e-5)
        with pytest.raises(InputMismatch, match=r"has shape \(3, 63\), but"):
            prog(x, out=torch.empty(3, 63))
        with pytest.raises(InputMismatch, match="out= has 2 tensors for 1 outputs"):
            prog(x, out=[out, out])
