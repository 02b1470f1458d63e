"""Every command the README shows (a `$ strata ...` line in an example, or an example's
`strata ...` title) runs as written and does what the README says (issue 29: the README's own
`generate --compare` failed). A command shown with an error sentence must fail with exactly that
sentence; every other one must exit 0. Paths to tiny checkpoints (/tmp/tinyllama, ./tiny-qwen)
and a GGUF file of the first, /tmp/tinyllama-q4_0.gguf, are made here; the tuning example gets a small budget. A new example in the README is tested
by adding it there, nothing else."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "models"))


def readme_commands() -> list[tuple[int, str, str | None]]:
    """(line, command, the error sentence shown after it or None)."""
    lines = (REPO / "README.md").read_text().splitlines()
    out, in_block = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_block = not in_block
            continue
        m = (re.match(r"^\$ ((?:strata|python) .*)$", line) if in_block else
             re.match(r"^`((?:strata|python) [^`]*)`", line))
        if not m or re.search(r"(?<![\w=])[A-Z]{3,}(?![\w=])", m.group(1).split("#")[0]) or \
                len(m.group(1).split()) < 3:          # prose about a command, or a placeholder
            continue
        after = lines[i + 1] if in_block and i + 1 < len(lines) else ""
        error = after if after.startswith("strata: ") and _is_error(after) else None
        out.append((i + 1, m.group(1).split("  #")[0].strip(), error))
    return out


def _is_error(line: str) -> bool:
    """A summary line ("strata: X (bundled config ...) ... in 3.5 s") is not an error."""
    return not re.search(r" in \d+(\.\d+)? s$|^strata: weights:", line)


COMMANDS = readme_commands()
SMALL = {"strata tune --suite": " --budget 3"}     # the README's ran for minutes


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    pytest.importorskip("transformers")
    from model_helpers import hf_model, write_checkpoint
    d = tmp_path_factory.mktemp("readme")
    write_checkpoint(hf_model("qwen2", seed=1), d / "tiny-qwen")
    llama = hf_model("llama", seed=3)
    write_checkpoint(llama, d / "tinyllama")
    from strata.models.gguf_write import write_gguf
    write_gguf(llama, d / "tinyllama-q4_0.gguf", "q4_0")
    return d


@pytest.mark.parametrize("line, command, error", COMMANDS, ids=[f"line{c[0]}" for c in COMMANDS])
def test_readme_command(line, command, error, workdir):
    if "--device cuda" in command and torch.cuda.is_available():
        pytest.skip("the README shows this command on a machine without a GPU")
    if ("--device cpu" in command or "tune" in command) and not shutil.which("cc") \
            and not shutil.which("gcc"):
        pytest.skip("no C compiler: the CPU target cannot run here")
    run = command.replace("/tmp/tinyllama", str(workdir / "tinyllama"))
    run += next((extra for prefix, extra in SMALL.items() if command.startswith(prefix)), "")
    env = dict(os.environ, STRATA_CACHE_DIR=str(workdir / "cache"), COLUMNS="120")
    proc = subprocess.run(["bash", "-c", run], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=600)
    first = (proc.stderr.strip().splitlines() or [""])[0]
    if error is None:
        assert proc.returncode == 0, f"README line {line}: {command}\n{proc.stderr[-2000:]}"
    else:
        assert proc.returncode != 0 and first == error, \
            f"README line {line}: expected `{error}`, got exit {proc.returncode}: `{first}`"
    assert "Traceback" not in proc.stderr


def test_the_readme_shows_commands():
    assert len(COMMANDS) >= 12 and sum(e is not None for *_, e in COMMANDS) >= 4
