"""Schedule knobs: each pin takes effect, is refused in one sentence, or says at -v that it does
not apply; the registry (strata/core/knobs.py) knows every knob the passes read."""
import pathlib
import re

import pytest

import strata
from strata.cli import main
from strata.core.context import Context
from strata.core.errors import KnobError, StrataError
from strata.core.knobs import KNOBS, describe_knobs

RMS = "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))"
SRC = pathlib.Path(strata.__file__).parent


def _one_error_line(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("strata: "), err
    assert "internal error" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("knob,words", [
    ("BLOKC=128", "did you mean BLOCK?"),
    ("BLOCK=abc", "multiple of 32"),
    ("BLOCK=100", "multiple of 32"),
    ("VEC=3", "power of two"),
    ("TILE_M=7", "TILE_M=7"),
    ("INSTR=foo", "wgmma, mma or fma"),
])
def test_bad_knobs_are_one_sentence(knob, words, capsys):
    err = _one_error_line(capsys, ["compile", "-c", RMS, "--ir", "tile", "--knob", knob])
    assert words in err
    assert "--knob help" in err or "takes" in err


def test_bad_env_knob_is_one_sentence(monkeypatch, capsys):
    monkeypatch.setenv("STRATA_KNOBS", "BLOCK=xyz")
    err = _one_error_line(capsys, ["compile", "-c", RMS, "--ir", "tile"])
    assert "BLOCK=xyz" in err and "STRATA_KNOBS" in err


def test_context_checks_typed_pins_from_torch_compile_options():
    ctx = Context(knobs={"block": 128, "CP_ASYNC": False, "INSTR": "MMA"})
    assert ctx.knobs == {"BLOCK": 128, "CP_ASYNC": False, "INSTR": "mma"}
    assert Context(knobs=ctx.knobs).knobs == ctx.knobs        # a context built from another's
    with pytest.raises(KnobError, match="GROUP takes 1 or a multiple of 32"):
        Context(knobs={"GROUP": 48})
    assert issubclass(KnobError, StrataError)
    with pytest.raises(AssertionError, match="not registered"):
        Context().knob("BLOKC", 1)


def test_rmsnorm_block_128_vec_1_takes_effect(capsys):
    pins = ["--knob", "BLOCK=128", "--knob", "VEC=1"]
    assert main(["compile", "-c", RMS, "--ir", "tile", *pins]) == 0
    tile = capsys.readouterr().out
    assert "# BLOCK=128, GROUP=128, VEC=1" in tile and "block=128" in tile
    assert "vec=" not in tile
    assert main(["compile", "-c", RMS, "--ir", "kernel", *pins]) == 0
    assert ".v4" not in capsys.readouterr().out
    assert main(["compile", "-c", RMS, "--ir", "cuda", *pins]) == 0
    cuda = capsys.readouterr().out
    assert "__launch_bounds__(128)" in cuda and "float4" not in cuda and "float2" not in cuda
    assert main(["run", "-c", RMS, "--device", "sim", *pins]) == 0
    assert "PASS" in capsys.readouterr().out


def test_pins_that_cannot_apply_say_so_at_v(capsys):
    argv = ["compile", "-c", RMS, "--ir", "tile", "-v",
            "--knob", "TILE_M=64", "--knob", "GROUP=256", "--knob", "BLOCK=128", "--knob", "VEC=8"]
    assert main(argv) == 0
    got = capsys.readouterr()
    log = got.out + got.err                 # the -v log goes to stderr (stdout before)
    assert "k_rms_norm_reduce: TILE_M=64 does not apply: its schedule has no such choice " \
           "(TILE_M is for contractions)" in log
    assert "BLOCK=128 does not apply: GROUP=256" in log
    assert log.count("VEC=8 does not apply") == 1
    assert "# BLOCK=256, GROUP=256, VEC=4" in got.out
    assert main(["compile", "-c", RMS, "--ir", "tile", "--knob", "TILE_M=64"]) == 0
    got = capsys.readouterr()
    assert "does not apply" not in got.out + got.err          # only at -v


def test_help_lists_every_knob_with_its_values():
    text = describe_knobs()
    for knob in KNOBS.values():
        assert re.search(rf"^  {knob.name} +{re.escape(knob.meaning)}$", text, re.M), knob.name
        assert knob.rule in text


def test_registry_holds_exactly_the_knobs_the_passes_read():
    code = "\n".join(p.read_text() for stage in ("loop", "tile", "kernel_ir")   # STORE: the
                     for p in (SRC / stage).rglob("*.py"))      # fusion plan; L2_PREFETCH: Kernel IR
    read = set(re.findall(r'ctx\.(?:knob|pinned)\(\s*"([A-Z_0-9]+)"', code))
    read |= set(re.findall(r'"([A-Z_0-9]+)" (?:not )?in ctx\.knobs', code))
    read |= set(re.findall(r'choose_pieces\([^)]*?"([A-Z_0-9]+)"', code))       # CHUNKS, SPLIT_K
    read |= set(re.findall(r'\("(PAD_[AB])", "[mn]0"\)', code))                    # pad_smem's loop
    assert read - set(KNOBS) == set(), "read by a pass but not in strata/core/knobs.py"
    assert set(KNOBS) - read == set(), "in strata/core/knobs.py but read by no pass"


def test_knob_help_lists_every_knob(capsys):
    from strata.core.knobs import KNOBS
    assert main(["compile", "--knob", "help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in KNOBS)
