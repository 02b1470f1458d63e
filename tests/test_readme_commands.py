"""Every listing of README.md and docs/*.md that shows a command's output is that command's output
today: the command runs as written and what it prints is compared with what the page shows
(issue 29: the README's own `generate --compare` failed; issue 30: listings had gone stale).

What is a listing (docs/design.md, "Listings", says the same for authors):
- in a fenced block, a line `$ strata ...` or `$ python ...` is a command (after `  # ` a comment);
  the lines after it, up to the next `$ ` line or the end of the block, are its output, stdout
  and stderr together, in the order they were written. A command with a placeholder (a word
  such as MODEL, DIR, FILE) or of fewer than three words is prose and is not run;
- a ```python block whose info string names a file (```python dsl_demo.py) is a script: it is
  written to that file and run with `python FILE`; the fenced block right after it (nothing but
  blank lines between) is its output;
- an HTML comment on the line before a block's fence changes that: `<!-- output not compared:
  WHY -->` runs the block's commands but does not compare what they print (a search whose winner
  changes from run to run); `<!-- record: WHY, YYYY-MM-DD -->` marks a dated record of one machine
  (`strata machine` on a named CPU) that is neither run nor compared.

A command whose shown output starts with an error sentence (`strata: unknown ...`) must exit
non-zero; every other command and every script must exit 0. A line `...` in a shown output
stands for any number of lines (a listing that leaves out a prelude or a long middle).

Compared after normalising both sides, so that what changes from run to run or machine to machine
does not fail the test and everything else does:
- the scratch directory the commands run in reads as /tmp (the pages say /tmp/tinyllama);
- a number followed by a unit of time, rate or size (`7.0 s`, `610.8 ms`, `1.58 tokens/s`,
  `0.66 MB`, ...) becomes `#` with its unit; `abs err X` and `rel err X` lose X (the CPU's
  rounding differs by vector width); `N threads` becomes `# threads` (the machine's cores);
- the `ids:` and `text:` a tiny random checkpoint generates become `#` (a near tie may tip the
  other way under another CPU's rounding); the `ids agree with hf eager` verdict is compared;
- runs of spaces become one space and trailing spaces go (column widths follow the numbers), a
  run of one box-drawing character becomes one (rich's table borders), leading and trailing
  blank lines go.
Paths to tiny checkpoints (/tmp/tinyllama, ./tiny-qwen) and a GGUF file of the first,
/tmp/tinyllama-q4_0.gguf, are made here; the tuning example gets a small budget. A command shown
on two pages runs once. `python tests/test_readme_commands.py --update` rewrites every listing
that differs (and has no `...`) with what its command prints now; check the diff before
committing it."""
from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "models"))
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
SMALL = {"strata tune --suite": " --budget 3"}     # the page's ran for minutes
NOT_COMPARED = re.compile(r"^<!-- output not compared: \S.* -->$")
RECORD = re.compile(r"^<!-- record: \S.*\d{4}-\d\d-\d\d.* -->$")


@dataclass
class Listing:
    page: str                       # "README.md", "docs/cli.md"
    line: int                       # 1-based line of the command or the script's fence
    command: str                    # what runs, in bash, in the scratch directory
    expected: list[str] = field(default_factory=list)
    compare: bool = True
    script: tuple[str, str] | None = None       # (file name, source) of a python listing
    span: tuple[int, int] = (0, 0)  # 0-based [start, end) of the shown output in the page

    @property
    def error(self) -> str | None:
        first = self.expected[0] if self.expected else ""
        return first if first.startswith("strata: ") and _is_error(first) else None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _is_error(line: str) -> bool:
    """A summary line ("strata: X (bundled config ...) ... in 3.5 s", "... page in 2.1 s; verdict
    PASS") is not an error."""
    return not re.search(r" in \d+(\.\d+)? s\b|^strata: weights:", line)


def _runnable(command: str) -> bool:
    """Not prose about a command: no placeholder word (MODEL, DIR) and at least three words."""
    return not re.search(r"(?<![\w=])[A-Z]{3,}(?![\w=])", command.split("#")[0]) and \
        len(command.split()) >= 3


def _blocks(lines: list[str]):
    """(fence line, info string, first body line, end line) of every fenced block."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            yield i, lines[i][3:].strip(), i + 1, j
            i = j
        i += 1


def _marker(lines: list[str], fence: int) -> str:
    before = lines[fence - 1].strip() if fence > 0 else ""
    if NOT_COMPARED.match(before):
        return "not compared"
    if RECORD.match(before):
        return "record"
    assert not before.startswith("<!-- output") and not before.startswith("<!-- record"), \
        f"line {fence}: a listing marker must read `<!-- output not compared: WHY -->` or " \
        f"`<!-- record: WHY, YYYY-MM-DD -->`, not `{before}`"
    return ""


def page_listings(path: Path) -> list[Listing]:
    lines = path.read_text().splitlines()
    page = str(path.relative_to(REPO))
    out: list[Listing] = []
    blocks = list(_blocks(lines))
    for n, (fence, info, start, end) in enumerate(blocks):
        marker = _marker(lines, fence)
        if marker == "record":
            continue
        words = info.split()
        if words[:1] == ["python"] and len(words) > 1 and words[1].endswith(".py"):
            source = "\n".join(lines[start:end]) + "\n"
            listing = Listing(page, fence + 1, f"python {words[1]}", compare=marker == "",
                              script=(words[1], source))
            nxt = blocks[n + 1] if n + 1 < len(blocks) else None
            if nxt and all(not s.strip() for s in lines[end + 1:nxt[0]]):
                listing.expected = lines[nxt[2]:nxt[3]]
                listing.span = (nxt[2], nxt[3])
            else:
                listing.compare = False
            out.append(listing)
            continue
        i = start
        while i < end:
            m = re.match(r"^\$ ((?:strata|python) .*)$", lines[i])
            if not m:
                i += 1
                continue
            j = i + 1
            while j < end and not lines[j].startswith("$ "):
                j += 1
            command = m.group(1).split("  #")[0].strip()
            if _runnable(command):
                out.append(Listing(page, i + 1, command, lines[i + 1:j], marker == "",
                                   span=(i + 1, j)))
            i = j
    return out


LISTINGS = [x for p in PAGES for x in page_listings(p)]


def normalise(text: str, workdir: Path | None = None) -> list[str]:
    if workdir is not None:
        text = text.replace(str(workdir), "/tmp")
    units = r"tokens/s|tok/s|GB/s|GiB/s|MB/s|GFLOP/s|TFLOP/s|MiB|MB|GiB|GB|KiB|KB|ms|us|µs|ns|s"
    text = re.sub(rf"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)? ?({units})(?![\w/])", r"# \1", text)
    text = re.sub(r"\b(abs err|rel err) [-+0-9.e]+", r"\1 #", text)
    text = re.sub(r"\b\d+ threads?\b", "# threads", text)
    text = re.sub(r"^(\s*)(ids|text): .*$", r"\1\2: #", text, flags=re.M)
    text = re.sub(r"([\u2500-\u257f])\1+", r"\1", text)
    lines = [re.sub(r" +", " ", line).strip() for line in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def matches(expected: list[str], actual: list[str]) -> bool:
    """expected == actual, where a line `...` of expected stands for any lines of actual."""
    parts, cur = [], []
    for line in expected:
        if line == "...":
            parts.append(cur)
            cur = []
        else:
            cur.append(line)
    parts.append(cur)
    if len(parts) == 1:
        return expected == actual
    first, *middle, last = parts
    if actual[:len(first)] != first or len(actual) < len(first) + len(last) or \
            (last and actual[-len(last):] != last):
        return False
    pos, stop = len(first), len(actual) - len(last)
    for part in middle:
        k = next((k for k in range(pos, stop - len(part) + 1)
                  if actual[k:k + len(part)] == part), None)
        if k is None:
            return False
        pos = k + len(part)
    return True


def make_workdir(d: Path) -> Path:
    """The tiny checkpoints the pages' commands name."""
    from model_helpers import hf_model, write_checkpoint
    write_checkpoint(hf_model("qwen2", seed=1), d / "tiny-qwen")
    llama = hf_model("llama", seed=3)
    write_checkpoint(llama, d / "tinyllama")
    from strata.models.gguf_write import write_gguf
    write_gguf(llama, d / "tinyllama-q4_0.gguf", "q4_0")
    return d


_RAN: dict[str, tuple[int, str]] = {}


def run_listing(listing: Listing, workdir: Path) -> tuple[int, str]:
    """(exit status, stdout and stderr together) of the listing's command, run once per process."""
    run = listing.command.replace("/tmp/tinyllama", str(workdir / "tinyllama"))
    run += next((extra for prefix, extra in SMALL.items() if run.startswith(prefix)), "")
    key = run if listing.script is None else run + "\0" + listing.script[1]
    if key not in _RAN:
        if listing.script is not None:
            (workdir / listing.script[0]).write_text(listing.script[1])
        env = dict(os.environ, STRATA_CACHE_DIR=str(workdir / "cache"), COLUMNS="120",
                   PYTHONUNBUFFERED="1")
        proc = subprocess.run(["bash", "-c", run], cwd=workdir, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=600)
        _RAN[key] = (proc.returncode, proc.stdout)
    return _RAN[key]


def _opencl_missing() -> str:
    sys.path.insert(0, str(REPO / "tests" / "dsl"))
    from dsl_devices import OPENCL_MISSING
    return OPENCL_MISSING


def skip_reason(listing: Listing) -> str:
    import torch
    text = listing.command + (listing.script[1] if listing.script else "")
    if "--device cuda" in text and torch.cuda.is_available():
        return "the page shows this command on a machine without a GPU"
    cpu = "--device cpu" in text or "tune" in text or 'device="cpu"' in text or \
        '"cpu"' in text
    if cpu and not shutil.which("cc") and not shutil.which("gcc"):
        return "no C compiler: the CPU target cannot run here"
    if '"opencl"' in text and _opencl_missing():
        return _opencl_missing()
    return ""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    pytest.importorskip("transformers")
    return make_workdir(tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("listing", LISTINGS, ids=[x.id for x in LISTINGS])
def test_listing(listing, workdir):
    reason = skip_reason(listing)
    if reason:
        pytest.skip(reason)
    rc, output = run_listing(listing, workdir)
    where = f"{listing.id}: {listing.command}"
    assert "Traceback" not in output, f"{where}\n{output[-3000:]}"
    if listing.error is None:
        assert rc == 0, f"{where} exited {rc}\n{output[-3000:]}"
    else:
        assert rc != 0, f"{where} should fail with `{listing.error}`, exited 0"
    if listing.compare:
        expected, actual = normalise("\n".join(listing.expected)), normalise(output, workdir)
        assert matches(expected, actual), f"{where}: the page shows another output " \
            f"(`python tests/test_readme_commands.py --update` rewrites it)\n" + \
            "\n".join(difflib.unified_diff(expected, actual, "page", "now", lineterm=""))


def test_the_pages_show_commands_and_their_output():
    readme = [x for x in LISTINGS if x.page == "README.md"]
    assert len(readme) >= 3 and all(x.compare for x in readme)
    assert len(LISTINGS) >= 30 and sum(x.error is not None for x in LISTINGS) >= 4
    assert sum(x.script is not None for x in LISTINGS) >= 3


def test_the_readme_test_command_is_the_one_ci_runs():
    """.ci/run ends with the README's test command, byte for byte."""
    last = (REPO / ".ci" / "run").read_text().rstrip("\n").splitlines()[-1]
    readme = (REPO / "README.md").read_text().splitlines()
    assert last in readme, "README.md must show .ci/run's last line as its test command"


def _anchor(heading: str) -> str:
    """GitHub's id of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_pages_resolve():
    """Every relative link of the README and docs/*.md names a file that exists, and a `#part` a
    heading of that page: moving text between pages must not leave links behind."""
    bad = []
    for page in PAGES:
        text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://|mailto:", target):
                continue
            path, _, part = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.name}: {target} (no such file)")
            elif part and dest.suffix == ".md":
                heads = re.findall(r"^#+ (.*)$", dest.read_text(), flags=re.M)
                if part not in {_anchor(h) for h in heads}:
                    bad.append(f"{page.name}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_normalise_and_elision():
    a = normalise("compiled in 7.0 s  \nprefill 610.8 ms, 1.58 tokens/s\n━━━━ x\nrel err 1.2e-07")
    assert a == ["compiled in # s", "prefill # ms, # tokens/s", "━ x", "rel err #"]
    assert normalise("decode 7 steps, 12 positions, (1, 32, 2048) f32") == \
        ["decode 7 steps, 12 positions, (1, 32, 2048) f32"]
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["...", "c"], ["a", "b", "c"]) and not matches(["a", "...", "x"], ["a", "b"])
    assert not matches(["a", "b"], ["a", "b", "c"])


def update() -> int:
    """Rewrite each listing whose command prints something else now (not those with `...`)."""
    d = make_workdir(Path(tempfile.mkdtemp(prefix="strata-listings-")))
    changed = 0
    for path in PAGES:
        listings = [x for x in page_listings(path) if x.compare]
        lines = path.read_text().splitlines()
        for x in sorted(listings, key=lambda x: -x.span[0]):
            if skip_reason(x):
                print(f"{x.id}: skipped ({skip_reason(x)})")
                continue
            rc, output = run_listing(x, d)
            if matches(normalise("\n".join(x.expected)), normalise(output, d)):
                continue
            if "..." in x.expected:
                print(f"{x.id}: differs, and shows `...`: edit it by hand\n{output}")
                continue
            new = [line.rstrip() for line in output.replace(str(d), "/tmp").splitlines()]
            while new and not new[-1]:
                new.pop()
            lines[x.span[0]:x.span[1]] = new
            changed += 1
            print(f"{x.id}: rewritten (exit {rc})")
        path.write_text("\n".join(lines) + "\n")
    print(f"{changed} listings rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(update() if "--update" in sys.argv else print(__doc__))
