"""The page in a real browser (headless Chromium driven by Selenium): it loads without a console
error, selecting an op highlights its kernels in every stage and back, stepping to a pass shows
its diff, search filters; a screenshot of each page is kept in the test's tmp directory (and, with
STRATA_VIEW_DOCS=DIR, written there for the docs). Each page is built once for the module: RMSNorm
(with its CPU verdict where a C compiler is found), a program with a @strata.kernel, and one Llama
decoder layer, whose load time in the browser is measured and printed (not asserted)."""
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from conftest import HAS_CC

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver") or next(
    (p for p in ("/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver") if os.path.exists(p)), None)
try:
    import selenium  # noqa: F401
except ImportError:
    selenium = None
if not (CHROMIUM and DRIVER and selenium):
    pytest.skip("the browser tests need Chromium, chromedriver and selenium (apt-get install "
                "chromium chromium-driver; pip install selenium), which are not all here",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from strata.view import render  # noqa: E402

RMSNORM = "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))"
ROOFLINE = "torch.softmax(torch.randn(64, 256), -1) @ torch.randn(256, 128)"
CEILINGS = {"DRAM read": 23.4, "LLC read": 45.8, "L2 read": 73.4, "fp32 FMA peak": 539.2,
            "bf16 AMX peak": 1803.8}
DOCS = os.environ.get("STRATA_VIEW_DOCS")


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{name: (path, the page's data)}; each page built once."""
    from strata.api import compile_model, compile_snippet
    from strata.bench.check import compare_with_eager
    from strata.view import collect, render
    from strata.view.record import recording
    sys.path.insert(0, str(Path(__file__).parent))
    import dsl_program
    out = tmp_path_factory.mktemp("view")
    built = {}
    device = "cpu" if HAS_CC else None
    program, snippet = compile_snippet(RMSNORM, recording(None), device=device)
    built["rmsnorm"] = (program, compare_with_eager(program, snippet) if device else None, "")
    built["dsl"] = (dsl_program.program(), None, "")
    program, model = compile_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0", layer=0,
                                   ctx=recording(None))
    built["layer"] = (program, None, f"{model.what}, seq 128")
    bench, profile = {}, None
    if HAS_CC:          # each kernel timed (--bench) against a profile's ceilings: the roofline
        from strata.tune.machine import Profile
        from strata.bench.cpu_bench import view_bench
        program, snippet = compile_snippet(ROOFLINE, recording(None), device="cpu")
        built["roofline"] = (program, compare_with_eager(program, snippet), "")
        bench["roofline"] = view_bench(program, snippet)
        profile = Profile("a CPU", "", "x86_64", 2, [], {}, "cpu-spr", CEILINGS, "2026-01-01")
    result = {}
    for name, (program, verdict, title) in built.items():
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("strata.tune.machine.cached", lambda: profile)
            data = collect(program, verdict=verdict, title=title, bench=bench.get(name))
        path = out / f"{name}.html"
        path.write_text(render(data), encoding="utf-8")
        result[name] = (path, data)
    return result


@pytest.fixture(scope="module")
def browser():
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,1000"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def open_page(browser, path):
    """Load the page; returns (ms from navigation to the script's end, the console's errors)."""
    browser.get_log("browser")                      # drop what an earlier page logged
    browser.get(path.as_uri())
    ready = browser.execute_script("return window.strataViewReady")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    return ready, errors


def screenshot(browser, tmp_path, name):
    path = tmp_path / f"{name}.png"
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    if DOCS:
        shutil.copy(path, Path(DOCS) / f"{name}.png")


def highlighted(browser, stage):
    return browser.find_elements(By.CSS_SELECTOR, f'.stage[data-stage="{stage}"] .ln.hl')


def current_pass(browser):
    return browser.find_element(By.CSS_SELECTOR, "#passes li.cur")


@pytest.mark.parametrize("name", ["rmsnorm", "dsl"])
def test_page_loads_without_console_errors(name, pages, browser, tmp_path):
    path, data = pages[name]
    ready, errors = open_page(browser, path)
    assert errors == [] and ready is not None
    titles = [e.text.split(" (")[0] for e in browser.find_elements(By.CSS_SELECTOR, ".stage h3")]
    assert titles == [s["title"] for s in data["stages"]]
    if name == "dsl":       # the hand-written kernel: its CUDA is the one its @strata.kernel gave
        (i,) = [i for i, k in enumerate(data["kernels"]) if k["src"].startswith("@strata.kernel")]
        browser.find_elements(By.CSS_SELECTOR, "#kernels li")[i].click()
        want = "// @strata.kernel rmsnorm ("
        WebDriverWait(browser, 10).until(
            lambda b: any(e.text.startswith(want) for e in highlighted(b, "cuda")))
        browser.execute_script("document.getElementById('stages').scrollLeft = 1e6")
    screenshot(browser, tmp_path, name)


def test_selecting_an_op_highlights_its_kernels_and_back(pages, browser):
    path, data = pages["rmsnorm"]
    open_page(browser, path)
    browser.find_element(By.CSS_SELECTOR, '.stage[data-stage="torch"] .ln.own').click()
    (kernel,) = data["kernels"]
    for stage, runs in kernel["lines"].items():     # lines are built as they scroll into view
        want = sum(b - a + 1 for a, b in runs)
        WebDriverWait(browser, 10).until(lambda b: len(highlighted(b, stage)) == want)
    assert browser.find_element(By.CSS_SELECTOR, '#kernels li.rel').text == kernel["name"]
    # clear the highlights, so that what follows is the second click's alone
    browser.execute_script("document.querySelectorAll('.ln.hl').forEach(e => e.classList.remove('hl'))")
    last = data["stages"][-1]["name"]
    line = browser.find_elements(By.CSS_SELECTOR, f'.stage[data-stage="{last}"] .ln.own')[0]
    browser.execute_script("arguments[0].scrollIntoView()", line)
    line.click()
    WebDriverWait(browser, 10).until(lambda b: highlighted(b, "torch"))
    torch_lines = [e.text for e in highlighted(browser, "torch")]
    assert len(torch_lines) == 1 and torch_lines[0].startswith("rms_norm = rms_norm(")
    assert browser.find_element(By.CSS_SELECTOR, "#ops li.rel").text.startswith("rms_norm")


def test_stepping_to_a_pass_shows_its_diff(pages, browser, tmp_path):
    path, data = pages["rmsnorm"]
    open_page(browser, path)
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys("k" * 30)                                 # the first pass
    assert current_pass(browser).text.split()[1] == "001"
    (fam,) = data["families"]
    changed = [data["passes"][i]["name"] for i, p in enumerate(fam["passes"]) if p[1]]
    seen = []
    for _ in fam["passes"]:
        cur = current_pass(browser)
        if "changed" in cur.get_attribute("class").split():
            assert cur.text.startswith("\u25cf")             # marked by a symbol, not colour only
            seen.append(cur.text.split()[2])
            diff = browser.find_element(By.ID, "diff").text
            assert "@@" in diff and any(line.startswith("+") for line in diff.splitlines())
            if len(seen) == 2:
                screenshot(browser, tmp_path, "rmsnorm-passes")
        else:
            assert cur.text.startswith("\u25cb")
            assert browser.find_element(By.ID, "diff").text == "(no change)"
        body.send_keys(Keys.ARROW_DOWN if len(seen) % 2 else "j")
    assert seen == changed and len(seen) >= 2


def test_search_filters_kernels_and_ops(pages, browser):
    path, data = pages["layer"]
    open_page(browser, path)
    box = browser.find_element(By.ID, "search")
    box.send_keys("linear_1")
    shown = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "nav li:not(.hidden)")]
    assert shown and all("linear_1" in s for s in shown)
    assert any(s.startswith("k_linear_1") for s in shown)
    box.send_keys(Keys.ENTER)
    assert "linear_1" in browser.find_element(By.CSS_SELECTOR, "nav li.sel").text


def test_decoder_layer_page(pages, browser, tmp_path, record_property):
    path, data = pages["layer"]
    size = path.stat().st_size
    assert size < 5e6 and data["replayed"]
    # the q, k and v projections are three ops with kernels of their own
    q, k, v = (next(o for o in data["ops"] if o["name"] == n) for n in ("linear", "linear_1", "linear_2"))
    assert q["kernels"] and k["kernels"] and v["kernels"]
    assert not set(q["kernels"]) & set(k["kernels"]) and not set(k["kernels"]) & set(v["kernels"])
    assert all(data["kernels"][i]["name"].startswith("k_linear_1") for i in k["kernels"])
    t0 = time.perf_counter()
    ready, errors = open_page(browser, path)
    wall = (time.perf_counter() - t0) * 1e3
    assert errors == []
    load = browser.execute_script(
        "return performance.getEntriesByType('navigation')[0].loadEventEnd")
    record = {"html_bytes": size, "kernels": len(data["kernels"]), "script_done_ms": ready,
              "load_event_ms": load, "driver_get_ms": wall}
    record_property("decoder_layer_page", json.dumps(record))
    (tmp_path / "load.json").write_text(json.dumps(record))
    print(f"\ndecoder layer page: {size / 1e6:.2f} MB, {len(data['kernels'])} kernels, script done "
          f"{ready:.0f} ms, load event {load:.0f} ms after navigation ({wall:.0f} ms by the driver)")
    browser.find_elements(By.CSS_SELECTOR, "#ops li")[0].click()
    screenshot(browser, tmp_path, "llama-layer")


def test_roofline_has_a_point_per_timed_kernel_and_selects_it(pages, browser, tmp_path):
    if "roofline" not in pages:
        pytest.skip("no C compiler: the kernels cannot be timed here")
    path, data = pages["roofline"]
    ready, errors = open_page(browser, path)
    assert errors == [] and ready is not None
    svg = browser.find_element(By.CSS_SELECTOR, "#roofline svg.roofline")
    points = svg.find_elements(By.CSS_SELECTOR, "circle.point")
    assert len(points) == len(data["bench"]["kernels"]) == len(data["kernels"])
    drawn = {e.get_attribute("data-ceiling") for e in svg.find_elements(By.CSS_SELECTOR, "line[data-ceiling]")}
    assert drawn == set(CEILINGS)
    browser.execute_script("document.getElementById('roofbox').scrollIntoView()")
    last = len(points) - 1
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))",
                           points[last])
    assert browser.find_element(By.CSS_SELECTOR, "#kernels li.sel").text == data["kernels"][last]["name"]
    assert "sel" in points[last].get_attribute("class").split()
    assert "FLOP/byte" in browser.find_element(By.ID, "knobs").text
    screenshot(browser, tmp_path, "roofline")
    no_profile = dict(data, roofline={"note": "no machine profile: run `strata machine --measure`"})
    (tmp_path / "np.html").write_text(render(no_profile), encoding="utf-8")
    ready, errors = open_page(browser, tmp_path / "np.html")
    assert errors == [] and not browser.find_elements(By.CSS_SELECTOR, "#roofline svg")
    assert browser.find_element(By.ID, "roofline").text == "no machine profile: run `strata machine --measure`"


def test_the_tuning_databases_candidates_are_listed_fastest_first(browser, tmp_path):
    from strata.api import compile_snippet
    from strata.core.context import Context
    from strata.loop.ir import signature
    from strata.tune.db import TuningDB
    from strata.view import write_page
    from strata.view.record import recording
    code = "torch.randn(64, 256) * 2"
    program, _ = compile_snippet(code, recording(Context(tuned=False)))
    (loop,) = program.lowered.loop.kernels
    sig = signature(loop, {b.name: b for b in program.lowered.loop.buffers})
    db = TuningDB(tmp_path / "t.sqlite")
    db.put(sig, program.lowered.target.key, {"VEC": 2}, "mul[64, 256]", 2.0, 1.5, 3, [], 0.0, 1.6,
           [[{"VEC": 1}, 3.2, 2.0], [{"VEC": 2}, 1.5, 2.1], [{"BLOCK": 64}, 2.4, 2.0]])
    program, _ = compile_snippet(code, recording(Context(tuned=db)))
    write_page(program, tmp_path / "tuned.html")
    ready, errors = open_page(browser, tmp_path / "tuned.html")
    assert errors == [] and ready is not None
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#tuning table.cands tr")][1:]
    assert rows == ["VEC=2 1.5000 0.714 winner", "default 2.0000 1.000 default",
                    "BLOCK=64 2.4000 1.200", "VEC=1 3.2000 1.600"]
    assert browser.find_element(By.CSS_SELECTOR, "#tuning tr.winner").text.startswith("VEC=2")
    knobs = {r.text.split()[0]: r.text.split()[2] for r in
             browser.find_elements(By.CSS_SELECTOR, "#knobs tr")[1:]}
    assert knobs["VEC"] == "tuned"              # the winner is what the compile used
    browser.execute_script("document.getElementById('knobs').scrollIntoView()")
    screenshot(browser, tmp_path, "tuning")
