"""The target as a value (strata/core/targets.py) and the pipeline each target kind names."""
import pytest
import torch

import strata
from strata.cli import main
from strata.core.context import Context
from strata.core.errors import StrataError
from strata.pipeline import CPU_PASSES, GPU_PASSES, schedule_passes
from strata.core.targets import TARGETS, get_target, host


def test_known_names_and_one_sentence_for_others():
    for name in ("sm_80", "sm_90", "sm_90a", "cpu", "cpu-avx2", "host"):
        assert get_target(name).name == name
    with pytest.raises(StrataError, match="unknown target 'hopper'; choose one of sm_70"):
        get_target("hopper")


def test_features_not_names_decide():
    assert TARGETS["sm_90a"].has("wgmma") and not TARGETS["sm_90"].has("wgmma")
    assert TARGETS["sm_80"].has("mma.sync") and not TARGETS["sm_75"].has("mma.sync")
    assert TARGETS["sm_90a"].fill_blocks == 2 * TARGETS["sm_90a"].cores
    assert not TARGETS["cpu-avx2"].is_gpu and TARGETS["cpu-avx2"].has("avx2")


def test_host_reads_this_cpu():
    h = host()
    assert h.kind == "cpu" and h.cores >= 1 and h.vector_bytes in (16, 32, 64)


def test_each_kind_names_its_pass_list():
    assert schedule_passes(get_target("sm_90a")) is GPU_PASSES
    assert schedule_passes(get_target("cpu")) is CPU_PASSES
    assert GPU_PASSES[0][0] == "tile_attention"        # attention is a pass, not a special case


def test_a_gpu_schedule_is_verified_after_every_pass(monkeypatch):
    """A pass that breaks the schedule is caught at once, naming the kernel."""
    from strata.tile import ir as tile_ir
    from strata.tile.passes import blockify_launch as bl
    real = bl.blockify_launch
    broken = [(n, (lambda k, ctx: tile_ir.replace(real(k, ctx), block=48) if k.mode == "rows"
                   else real(k, ctx)) if n == "blockify_launch" else fn) for n, fn in GPU_PASSES]
    monkeypatch.setattr("strata.pipeline.PIPELINES", {"gpu": broken, "cpu": CPU_PASSES})
    with pytest.raises(tile_ir.TileVerifyError, match="k_softmax_reduce.*multiple of the warp"):
        strata.compile(lambda x: x.softmax(-1), (torch.randn(4, 100),), ctx=Context(target="sm_80"))


def test_cpu_target_compiles_to_c_and_runs_natively(capsys):
    assert main(["compile", "-c", "torch.softmax(torch.randn(64, 1000), dim=-1)", "--ir", "c"]) == 0
    out = capsys.readouterr().out
    assert "#pragma omp parallel" in out and "reduction(+:acc1)" in out and "void strata_run" in out
    assert main(["run", "-c", "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))", "--device", "cpu"]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["run", "-c", "torch.randn(4) + 1", "--device", "cpu", "--target", "sm_80"], "is a GPU"),
    (["run", "-c", "torch.randn(4) + 1", "--device", "sim", "--target", "cpu"], "--device cpu"),
    (["compile", "-c", "torch.randn(4) + 1", "--ir", "cuda", "--target", "cpu"], "--ir c"),
])
def test_target_mismatches_are_one_sentence(argv, says, capsys):
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


def test_strata_compile_runs_cpu_tensors_natively():
    x, w = torch.randn(3, 64), torch.randn(64, dtype=torch.bfloat16)
    fn = lambda a, b: torch.nn.functional.rms_norm(a, (64,), b.float()) * 2   # noqa: E731
    prog = strata.compile(fn, (x, w), device="cpu")
    assert type(prog.runtime).__name__ == "NativeProgram"
    torch.testing.assert_close(prog(x, w), fn(x, w), rtol=1e-5, atol=1e-5)
