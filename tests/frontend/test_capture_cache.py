"""The capture cache: a second compile of a snippet reads the Torch IR back instead of running
torch.export, and everything downstream is identical to a fresh capture."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from strata.api import compile_snippet
from strata.core.context import Context
from strata.frontend import capture_cache
from strata.pipeline import STAGES

SNIPPETS = [
    "torch.nn.RMSNorm(2048)(torch.randn(1,32,2048))",
    "torch.softmax(torch.randn(4, 33) * 2, dim=-1).sum(0), torch.randn(3)[1:]",   # tuple output
    "torch.nn.LayerNorm(17)(torch.randn(5, 17)).to(torch.bfloat16)",
    "torch.relu(torch.matmul(torch.randn(8, 16) + torch.randn(16), torch.randn(16, 12)))",
]


def _compile(code):
    ctx = Context()
    prog, snippet = compile_snippet(code, ctx)
    return prog, snippet, ctx.messages


@pytest.mark.parametrize("code", SNIPPETS)
def test_cached_program_lowers_identically(cache_dir, code):
    first, snippet, log1 = _compile(code)
    second, _, log2 = _compile(code)
    assert any(m.startswith("capture (torch.export)") for m in log1)
    assert any(m.startswith("capture (cached)") for m in log2)
    for stage in STAGES[:STAGES.index("cuda") + 1]:     # a GPU program has no C (nor asm)
        assert second.ir(stage) == first.ir(stage), stage
    for a, b in zip(first.run_numpy(snippet.example_inputs), second.run_numpy(snippet.example_inputs)):
        np.testing.assert_array_equal(a, b)
    eager = snippet.module(*snippet.example_inputs)
    got = second(*snippet.example_inputs)
    assert type(got) is type(eager)      # the output structure survives the round trip


def test_different_code_different_entry(cache_dir):
    assert capture_cache.entry_path("torch.relu(torch.randn(3))") != \
        capture_cache.entry_path("torch.relu(torch.randn(4))")
    assert capture_cache.entry_path("torch.relu(torch.randn(3))") == \
        capture_cache.entry_path("  torch.relu(torch.randn(3)) ")


@pytest.mark.parametrize("damage", [b"", b"garbage", "truncate"])
def test_corrupt_entry_is_recaptured(cache_dir, damage):
    code = SNIPPETS[0]
    good, _, _ = _compile(code)
    path = capture_cache.entry_path(code)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else damage)
    again, _, log = _compile(code)
    assert any(m.startswith("capture (torch.export)") for m in log)
    assert again.ir("cuda") == good.ir("cuda")
    assert capture_cache.load(code) is not None          # the entry was rewritten


def test_caching_off(cache_dir, monkeypatch):
    monkeypatch.setenv("STRATA_NO_CACHE", "1")
    _compile(SNIPPETS[0])
    assert not any(cache_dir.rglob("*.pkl"))


def test_unwritable_dir_still_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("STRATA_CACHE_DIR", str(blocker))
    prog, snippet, _ = _compile("torch.exp(torch.randn(7))")
    np.testing.assert_allclose(prog(*snippet.example_inputs).numpy(),
                               torch.exp(snippet.example_inputs[0]).numpy(), rtol=1e-6)


def test_second_process_skips_export(cache_dir):
    """A fresh process (the CLI) finds the entry the first one wrote and never imports dynamo."""
    code = SNIPPETS[0]
    probe = ("import sys; from strata.cli import main; main(['compile', '-c', %r, '--ir', 'loop', '-v']);"
             "print('DYNAMO', 'torch._dynamo' in sys.modules)" % code)
    runs = [subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert "capture (torch.export)" in runs[0].stderr and "DYNAMO True" in runs[0].stdout
    assert "capture (cached)" in runs[1].stderr and "DYNAMO False" in runs[1].stdout
