"""Where strata keeps what it can reuse across processes (captured programs, compiled kernels).

`$STRATA_CACHE_DIR` if set, else `$XDG_CACHE_HOME/strata` (when absolute), else `~/.cache/strata`. Setting
`STRATA_NO_CACHE=1` turns every persistent cache off (each stage then recomputes everything).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def user_cache_dir() -> Path:
    if os.environ.get("STRATA_CACHE_DIR"):
        return Path(os.environ["STRATA_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "strata"   # XDG: absolute only


def caching_enabled() -> bool:
    return os.environ.get("STRATA_NO_CACHE", "").lower() not in ("1", "true", "yes", "on")


def write_atomically(path: Path, data: bytes) -> None:
    """`path` holds `data` whole or not at all (a temp file beside it, then os.replace): a reader
    in another process, or a run cut short, never sees half an entry or half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
