"""The view's data, without a browser: every stage, provenance from op to kernel to lines, each
kernel's pass history replayed from the -vv log, knob sources."""
import difflib
import json
import random
import re

import pytest

from conftest import HAS_CC
from strata.api import compile_snippet
from strata.core.context import Context
from strata.view import collect, render
from strata.view.passes import apply_diff
from strata.view.record import recording

RMSNORM = "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))"


@pytest.fixture(scope="module")
def rms():
    program, _ = compile_snippet(RMSNORM, recording(Context()))
    return program, collect(program)


def stage_text(data, name):
    return next(data["texts"][s["text"]] for s in data["stages"] if s["name"] == name)


def test_every_stage_is_there_as_compile_prints_it(rms):
    program, data = rms
    assert [s["name"] for s in data["stages"]] == ["torch", "tensor", "loop", "tile", "kernel", "cuda"]
    for s in data["stages"]:
        assert stage_text(data, s["name"]) == program.ir(s["name"])


def test_provenance_maps_the_op_to_its_kernel_and_its_lines(rms):
    _, data = rms
    (op,) = [o for o in data["ops"] if o["op"] == "aten.rms_norm"]
    (k,) = data["kernels"]
    assert k["name"] == "k_rms_norm_reduce" and op["kernels"] == [0] and k["ops"] == [0]
    assert "rms_norm_sum" in op["tensor"]
    torch_lines = stage_text(data, "torch").splitlines()
    assert all(torch_lines[i].startswith("rms_norm = rms_norm(")
               for i in data["opLines"]["torch"]["0"])
    cuda = stage_text(data, "cuda").splitlines()
    (first, last), = k["lines"]["cuda"]
    body = cuda[first:last + 1]
    assert body[0] == "// aten.rms_norm @ <snippet>:1" and body[-1] == "}"
    assert any(line.startswith("k_rms_norm_reduce(") for line in body)
    for stage in ("loop", "tile", "kernel"):
        (a, b), = k["lines"][stage]
        assert "k_rms_norm_reduce" in stage_text(data, stage).splitlines()[a] and b > a


def test_changed_passes_are_marked_with_their_diff(rms):
    _, data = rms
    names = {p["num"]: p["name"] for p in data["passes"]}
    (fam,) = data["families"]
    steps = {names[num]: (changed, diff, notes) for num, changed, diff, notes in fam["passes"]}
    changed, diff, _ = steps["vectorize"]
    assert changed and "+kernel k_rms_norm_reduce  # GROUP=256, VEC=4" in data["texts"][diff]
    changed, diff, notes = steps["tile_matmul"]
    assert not changed and diff == -1
    assert any("declined" in data["texts"][n] for n in notes)
    assert data["replayed"]        # the log's diffs, replayed, give the final Tile IR exactly


def test_knobs_and_where_they_came_from():
    program, _ = compile_snippet(RMSNORM, recording(Context(knobs={"VEC": "2"})))
    (k,) = collect(program)["kernels"]
    knobs = {name: (value, source) for name, value, source, _ in k["knobs"]}
    assert knobs["VEC"] == ("2", "pinned") and knobs["BLOCK"][1] == "default rule"
    assert "GROUP" in knobs


def test_program_view_lowers_again_with_the_same_knobs(tmp_path):
    import strata
    import torch
    program = strata.compile(lambda x: torch.softmax(x, -1), (torch.randn(8, 256),),
                             ctx=Context(knobs={"BLOCK": "64"}))
    path = program.view(str(tmp_path / "p.html"))
    html = open(path).read()
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>',
                                html, re.S)[1])
    assert stage_text(data, "cuda") == program.ir("cuda")
    assert all(["BLOCK", "64", "pinned"] == row[:3] for k in data["kernels"] for row in k["knobs"]
               if row[0] == "BLOCK")


def test_the_page_embeds_every_text_once_and_needs_no_network(rms):
    _, data = rms
    html = render(data)
    assert len(set(data["texts"])) == len(data["texts"])
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)


def test_apply_diff_inverts_difflib():
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 12))]
        b = list(a)
        for _ in range(rng.randint(1, 4)):
            op = rng.randint(0, 2)
            i = rng.randint(0, len(b))
            if op == 0:
                b.insert(i, rng.choice("xyz"))
            elif b and i < len(b):
                if op == 1:
                    del b[i]
                else:
                    b[i] = rng.choice("xyz")
        diff = "\n".join(list(difflib.unified_diff(a, b, lineterm="", n=rng.randint(0, 2)))[2:])
        assert apply_diff(a, diff) == b


def test_no_text_can_end_the_data_script_early(rms):
    _, data = rms
    data = dict(data, texts=data["texts"] + ['</script><!--<script> "quoted" </SCRIPT>'])
    html = render(data)
    assert html.lower().count("</script>") == 2 and "<!--" not in html
    got = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>',
                               html, re.S)[1])
    assert got == data


native = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot load")


def fake_profile(**ceilings):
    from strata.tune.machine import Profile
    return Profile("a CPU", "", "x86_64", 2, [], {}, "cpu-spr", ceilings, "2026-01-01 00:00 UTC")


@native
def test_roofline_has_one_point_per_timed_kernel_and_the_profiles_ceilings(monkeypatch):
    from strata.tune.cost import kernel_work
    program, _ = compile_snippet("torch.softmax(torch.randn(64, 256), -1) @ torch.randn(256, 128)",
                                 recording(Context()), device="cpu")
    names = [k.name for k in program.kernels]
    assert len(names) >= 2
    timed = {n: 0.01 * (i + 1) for i, n in enumerate(names[1:])}     # the first one untimed
    bench = {"whole": {"eager": 1.0, "torch.compile": 1.0, "strata": 1.0}, "kernels": timed,
             "rounds": 11, "busy": ""}
    profile = fake_profile(**{"DRAM read": 20.0, "L2 read": 70.0, "fp32 FMA peak": 500.0,
                              "fp32 matmul (FMA)": 180.0})
    monkeypatch.setattr("strata.tune.machine.cached", lambda: profile)
    roof = collect(program, bench=bench)["roofline"]
    assert [p["name"] for p in roof["points"]] == names[1:]
    for p in roof["points"]:
        k = program.kernels[p["kernel"]]
        assert (p["flops"], p["bytes"]) == kernel_work(k) and p["ms"] == timed[k.name]
        assert p["gflops"] == pytest.approx(p["flops"] / (p["ms"] * 1e6))
    svg = roof["svg"]
    assert svg.count('<circle ') == len(timed) and "</svg>" in svg
    drawn = re.findall(r'<line [^>]*class="ceiling (mem|flop) c\d+" data-ceiling="([^"]+)"', svg)
    assert sorted(drawn) == [("flop", "fp32 FMA peak"), ("mem", "DRAM read"), ("mem", "L2 read")]
    assert "fp32 matmul" not in svg            # a matmul's ceiling is not the machine's roof


@native
def test_roofline_without_a_profile_says_how_to_measure_one(monkeypatch):
    program, _ = compile_snippet("torch.randn(64, 256) * 2", recording(Context()), device="cpu")
    bench = {"whole": {}, "kernels": {k.name: 0.01 for k in program.kernels}}
    monkeypatch.setattr("strata.tune.machine.cached", lambda: None)
    assert collect(program, bench=bench)["roofline"] == {
        "note": "no machine profile: run `strata machine --measure`"}
    assert collect(program)["roofline"] is None                  # no timings, no roofline


def test_kernel_work_counts_the_float_operations_of_one_branch():
    from strata.tune.cost import kernel_work
    program, _ = compile_snippet("torch.randn(128, 256, dtype=torch.bfloat16) @ "   # AMX tiles:
                                 "torch.randn(256, 512, dtype=torch.bfloat16)",     # none overhangs
                                 Context(target="cpu-spr"))                        # M (any CPU)
    (k,) = program.kernels
    assert kernel_work(k) == (2 * 128 * 256 * 512, (128 * 256 + 256 * 512 + 128 * 512) * 2)
