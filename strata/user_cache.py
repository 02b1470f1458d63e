"""Where strata keeps what it can reuse across processes (captured programs, compiled kernels).

`$STRATA_CACHE_DIR` if set, else `$XDG_CACHE_HOME/strata` (when absolute), else `~/.cache/strata`. Setting
`STRATA_NO_CACHE=1` turns every persistent cache off (each stage then recomputes everything).
"""
from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    if os.environ.get("STRATA_CACHE_DIR"):
        return Path(os.environ["STRATA_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "strata"   # XDG: absolute only


def caching_enabled() -> bool:
    return os.environ.get("STRATA_NO_CACHE", "").lower() not in ("1", "true", "yes", "on")
