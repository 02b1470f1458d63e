"""Processes that build one source through a persistent cache at the same moment: shared by the
cubin cache tests (test_cache.py) and the native library cache tests (test_native.py).

Each child skips strata/__init__ (so that it starts fast), says it is ready, waits for "go",
runs `build` and prints the compiles it made and the sha256 of what it got."""
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import hashlib, sys, time, types
from pathlib import Path
strata = types.ModuleType("strata")
strata.__path__ = [str(Path.cwd() / "strata")]
sys.modules["strata"] = strata
{imports}
src, ready, go = Path(sys.argv[1]).read_text(), Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
deadline = time.time() + 60
while not go.exists() and time.time() < deadline:
    time.sleep(0.002)
image = {build}
print({compiles}, hashlib.sha256(image).hexdigest())
"""


def race(tmp_path: Path, src: str, n: int, imports: str, build: str, compiles: str,
         timeout: float = 120) -> list[tuple[int, str]]:
    """Start n children on `src` released together; their (compiles, sha256), in start order."""
    path, go = tmp_path / "src", tmp_path / "go"
    path.write_text(src)
    child = CHILD.format(imports=imports, build=build, compiles=compiles)
    procs = [subprocess.Popen([sys.executable, "-c", child, str(path), str(tmp_path / f"ready{i}"),
                               str(go)], env=dict(os.environ), cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(n)]
    deadline = time.time() + 60
    while sum((tmp_path / f"ready{i}").exists() for i in range(n)) < n and time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.005)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        count, digest = out.split()
        results.append((int(count), digest))
    return results
