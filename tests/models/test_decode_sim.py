"""KV-cache decoding through every stage and the simulator (strata/models/decode.py).

Tiny random models of each family are written as safetensors checkpoints and loaded back; a
prefill program and one decode-step program (the position an input) decode 8 greedy tokens that
must be Hugging Face generate's, with every step's logits within fp32 tolerance of a float64 run
of transformers' own cached forward. The cache write (index_copy_ at a tensor-valued position)
is a Scatter stored in place: only the new row changes.
"""
import copy

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import torch  # noqa: E402

from conftest import HAS_CC, compile_with_nvrtc  # noqa: E402
from model_helpers import FAMILIES, hf_model, write_checkpoint  # noqa: E402
import strata  # noqa: E402
from strata.bench import check  # noqa: E402
from strata.models.build import build  # noqa: E402
from strata.models.decode import compile_decoder, new_caches  # noqa: E402
from strata.runtime.program import mutated_inputs  # noqa: E402

PROMPT, NEW, MAX_LEN = 4, 8, 16


def _assert_close(name, got, ref):
    res = check.compare(name, "f32", got, ref, check.tolerance("f32", True))
    assert res.passed, f"{name}: rel err {res.rel:.3g}, max abs {res.max_abs:.3g} (tol {res.tol})"


def _writers(program, part: str) -> dict:
    """{buffer whose name holds `part`: [points of the domain of each kernel writing it]}."""
    out: dict = {}
    for k in program.lowered.tile.kernels:
        for w in k.writes:
            if part in w:
                n = 1
                for _, extent in k.domain:
                    n *= extent
                out.setdefault(w, []).append(n)
    return out


def _f64_step_logits(model64, prompt, tokens):
    """Last-position logits of transformers' own cached decoding, in float64, per step."""
    out = []
    with torch.no_grad():
        r = model64(input_ids=torch.tensor([prompt]), use_cache=True)
        out.append(r.logits[0, -1].numpy())
        past = r.past_key_values
        for t in tokens[:-1]:
            r = model64(input_ids=torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past = r.past_key_values
            out.append(r.logits[0, -1].numpy())
    return out


@pytest.mark.parametrize("device", [
    "sim", pytest.param("cpu", marks=pytest.mark.skipif(not HAS_CC, reason="no C compiler"))])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_decode_matches_hf_generate(family, device, tmp_path):
    ref = hf_model(family)
    write_checkpoint(ref, tmp_path)
    built = build(str(tmp_path), dtype="fp32", materialise=True)
    prefill, step = compile_decoder(built.model, PROMPT, MAX_LEN, device=device)
    prompt = torch.randint(0, ref.config.vocab_size, (PROMPT,)).tolist()
    caches = new_caches(ref.config, MAX_LEN, torch.float32)
    logits = [prefill(torch.tensor([prompt]), *caches)]
    ids = [int(logits[-1][0, -1].argmax())]
    for pos in range(PROMPT, PROMPT + NEW - 1):
        logits.append(step(torch.tensor([[ids[-1]]]), torch.tensor([pos]), *caches))
        ids.append(int(logits[-1][0, -1].argmax()))
    ref.generation_config.eos_token_id = None       # 8 tokens, an end-of-sequence id or not
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                            pad_token_id=0)[0, PROMPT:].tolist()
    assert ids == want
    model64 = copy.deepcopy(ref).double()
    for k, (got, r) in enumerate(zip(logits, _f64_step_logits(model64, prompt, ids))):
        _assert_close(f"{family} step {k}", got[0, -1].numpy(), r)


def test_a_step_writes_each_layers_caches_in_one_kernel():
    """The K and V writes of a layer share their positions: one kernel (loop/scatter.py)."""
    _, step = compile_decoder(hf_model("llama3"), 3, 12)        # 2 layers
    writers = [k.writes for k in step.lowered.loop.kernels if any("cache" in w for w in k.writes)]
    assert sorted(writers) == [("k_cache_0", "v_cache_0"), ("k_cache_1", "v_cache_1")]


def test_the_position_input_drives_one_compiled_step():
    """One step program at several positions: each writes only its row of every cache and gives
    the logits of the model on prompt[:pos] + [token]."""
    ref = hf_model("llama3")
    prompt = torch.randint(0, ref.config.vocab_size, (6,)).tolist()
    prefill, step = compile_decoder(ref, len(prompt), 8)
    assert set(mutated_inputs(step.lowered.kernel)) == {f"{kv}_cache_{i}" for i in range(2)
                                                         for kv in "kv"}
    writers = _writers(step, "cache")            # in place: one kernel per cache, over one row
    assert sorted(writers) == sorted(mutated_inputs(step.lowered.kernel))
    assert all(len(ks) == 1 and ks[0] == 2 * 16 for ks in writers.values())   # kv heads x head dim
    caches = new_caches(ref.config, 8, torch.float32)
    prefill(torch.tensor([prompt]), *caches)
    token = next(t for t in torch.randperm(ref.config.vocab_size).tolist() if t not in prompt)
    model64 = copy.deepcopy(ref).double()
    seen = []
    for pos in (6, 2, 4):
        before = [c.clone() for c in caches]
        logits = step(torch.tensor([[token]]), torch.tensor([pos]), *caches)
        for b, c in zip(before, caches):
            changed = (b != c).any(dim=-1)[0].any(dim=0)          # per cache row
            assert changed.nonzero().flatten().tolist() == [pos]
        with torch.no_grad():
            want = model64(torch.tensor([prompt[:pos] + [token]])).logits[0, -1].numpy()
        _assert_close(f"step at {pos}", logits[0, -1].numpy(), want)
        seen.append(logits)
        prefill(torch.tensor([prompt]), *caches)      # restore rows 0..5 for the next position
    assert not torch.equal(seen[0], seen[1])
    compile_with_nvrtc(step)


def test_index_copy_and_index_put_at_tensor_positions():
    """The rules on their own: in-place updates write the caller's tensor, functional ones copy."""
    def functional(cache, pos, k):
        return cache.index_copy(1, pos, k * 2).sum(0)

    class InPlace(torch.nn.Module):
        def forward(self, cache, pos, k):
            cache[:, pos] = torch.tanh(k)
            return cache * 3

    cache, k = torch.randn(3, 10, 8), torch.randn(3, 2, 8)
    pos = torch.randperm(10)[:2]
    prog = strata.compile(functional, (cache, pos, k))
    assert _writers(prog, "index_copy") == {"index_copy": [3 * 10 * 8, 3 * 2 * 8]}   # copy, rows
    got = prog(cache, pos, k)
    _assert_close("index_copy", got.numpy(), functional(cache.double(), pos, k.double()).numpy())

    prog = strata.compile(InPlace(), (cache.clone(), pos, k))
    assert mutated_inputs(prog.lowered.kernel) == ["cache"]
    assert _writers(prog, "cache") == {"cache": [3 * 2 * 8]}
    mine, theirs = cache.clone(), cache.double()
    got = prog(mine, pos, k)
    want = InPlace()(theirs, pos, k.double())
    _assert_close("index_put out", got.numpy(), want.numpy())
    _assert_close("index_put cache", mine.numpy(), theirs.numpy())
    compile_with_nvrtc(prog)


@pytest.mark.parametrize("device", ["sim", pytest.param("cpu", marks=pytest.mark.skipif(
    not HAS_CC, reason="no C compiler"))])
def test_a_new_cache_written_in_place_and_returned(device):
    """transformers' static cache at its first call: zeros made in the graph, the prompt's rows
    written into them and the cache returned. The scatter lives in the zeros' buffer, which is
    then the program's output (it was a temp no runtime handed back)."""
    def first_step(k, pos):
        keys = torch.zeros(1, 2, 9, 4, dtype=k.dtype)
        keys.index_copy_(2, pos, k)
        return keys, k.sum()

    k, pos = torch.randn(1, 2, 3, 4), torch.tensor([0, 1, 2])
    prog = strata.compile(first_step, (k, pos), device=device)
    got, total = prog(k, pos)
    want, want_total = first_step(k.double(), pos)
    _assert_close("cache", got.numpy(), want.numpy())
    _assert_close("sum", total.numpy(), want_total.numpy())


def _sim_driver(monkeypatch):
    """tests/runtime's simulated CUDA driver (kernels run in the simulator, driver calls counted),
    with NVRTC left out."""
    import importlib.util
    from pathlib import Path

    from strata.runtime import program as runtime_program
    path = Path(__file__).parents[1] / "runtime" / "test_cuda_program.py"
    spec = importlib.util.spec_from_file_location("_cuda_program_tests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(runtime_program, "compile_cubin", lambda source, arch, names: b"cubin")
    return mod


def test_cuda_runtime_writes_the_callers_cache(monkeypatch):
    """CudaProgram on the simulated driver (tests/runtime): the step's kernels get the caller's
    cache pointers, so the cache is updated where it lies; nothing else of it is copied."""
    from strata.runtime.program import CudaProgram
    mod = _sim_driver(monkeypatch)
    ref = hf_model("smollm2")
    prompt = torch.randint(0, ref.config.vocab_size, (3,)).tolist()
    prefill, step = compile_decoder(ref, len(prompt), 6)
    kp, tp = step.lowered.kernel, step.torch_program
    rt = CudaProgram(kp, inputs=tp.inputs, weights=tp.weights, device="cpu",
                     driver=mod.SimDriver(kp), poison=True)
    caches = new_caches(ref.config, 6, torch.float32)
    prefill(torch.tensor([prompt]), *caches)
    mirror = [c.clone() for c in caches]
    ptrs = [c.data_ptr() for c in caches]
    got = rt.run([torch.tensor([[5]]), torch.tensor([3]), *caches])[0]
    want = step(torch.tensor([[5]]), torch.tensor([3]), *mirror)        # the simulator path
    assert [c.data_ptr() for c in caches] == ptrs
    for c, m in zip(caches, mirror):
        assert torch.equal(c, m) and not torch.equal(c[:, :, 3], torch.zeros_like(c[:, :, 3]))
    assert torch.equal(got, want)
    with pytest.raises(strata.core.errors.InputMismatch, match="updated in place"):
        rt.run([torch.tensor([[5]]), torch.tensor([3]), caches[0].transpose(2, 3).contiguous()
                .transpose(2, 3), *caches[1:]])


@pytest.mark.parametrize("picks", ["greedy", "sampling"])
def test_a_picking_step_replays_one_graph_with_nothing_updated(picks, monkeypatch):
    """On CUDA (the simulated driver) a step that picks its id (Greedy, or a Sampling reading
    its uniform from the run's uniforms by position) advances its own token and position and
    writes the id into the caller's tensor: after the call that builds the graph, later tokens
    are graph launches with no kernel node updated, and the ids are the simulator path's."""
    from fake_cuda import counts
    from strata.models.sampling import Greedy, Sampling
    from strata.runtime.program import CudaProgram
    mod = _sim_driver(monkeypatch)
    ref = hf_model("smollm2")
    prompt = torch.randint(0, ref.config.vocab_size, (3,)).tolist()
    s = Greedy() if picks == "greedy" else Sampling(temperature=0.9, top_k=8, seed=5)
    prefill, step = compile_decoder(ref, len(prompt), 8, sampling=s)
    kp, tp = step.lowered.kernel, step.torch_program
    driver = mod.SimDriver(kp)
    rt = CudaProgram(kp, inputs=tp.inputs, weights=tp.weights, device="cpu", driver=driver,
                     poison=True, units=step.lowered.units)
    caches = new_caches(ref.config, 8, torch.float32)
    u = (torch.rand(8),) if picks == "sampling" else ()
    first = prefill(torch.tensor([prompt]), *u, *caches)
    mirror = [c.clone() for c in caches]
    token, position, picked = first.clone(), torch.tensor([3]), torch.empty(1, 1, dtype=torch.long)
    t2, p2 = first.clone(), torch.tensor([3])
    for k in range(4):
        before = counts()
        rt.run([token, position, *u, *caches], out=[picked])
        want = step(t2, p2, *u, *mirror)                     # the simulator path
        after = counts()
        assert int(picked) == int(token) == int(want) == int(t2) and int(position) == 4 + k
        if k >= 2:       # call 1 launches plainly, call 2 builds the graph
            assert (after["graph_launches"] - before["graph_launches"],
                    after["node_updates"] - before["node_updates"]) == (1, 0)
    assert driver.errors == []
