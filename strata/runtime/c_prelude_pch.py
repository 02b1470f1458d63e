"""gcc parses the C prelude once per compiler and flags, not once per program.

Every C program strata emits begins with its prelude (codegen/c_prelude.py: libc headers, omp.h,
immintrin.h, strata's helpers), most of gcc's time on a small program (Zen 4: 0.13 of 0.21 s on a
tanh, 0.14 of 0.40 s on a decoder layer). It is built once as a gcc precompiled header under
<user cache dir>/pch/<key>/, and a program is compiled with its prelude replaced by `#include` of
it: the same translation unit by textual inclusion, and gcc uses a precompiled header only where
it is valid for the command, so the library is byte for byte the plain compile's
(tests/runtime/test_c_prelude_pch.py). Not gcc, STRATA_NO_CACHE=1, a source not beginning with the
prelude, or a header gcc refuses: compiled as it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from ..core.user_cache import caching_enabled, user_cache_dir

_BUILT: dict[Path, Path | None] = {}     # folder -> its header; None: gcc refused it


@cache
def prelude() -> str:
    """The prelude as codegen/c.py writes it (imported at the first compile: a process that only
    reads the cache does without the emitter)."""
    from ..codegen.c_prelude import PRELUDE
    return PRELUDE.rstrip()


def on_prelude_header(source: str, cmd: list[str], flags: tuple, identity: dict) -> str:
    """`source` with its prelude replaced by `#include` of the precompiled one, or as it is."""
    text = prelude()
    start = source.find(text)
    if (start < 0 or not caching_enabled() or "Free Software Foundation" not in identity["version"]
            or any(line.strip() and not line.startswith("//") for line in source[:start].splitlines())):
        return source
    key = hashlib.sha256(json.dumps([text, identity, list(flags)]).encode()).hexdigest()[:24]
    folder = user_cache_dir() / "pch" / key
    if folder not in _BUILT or _BUILT[folder] is not None and not (folder / "prelude.h.gch").exists():
        _BUILT[folder] = _build(folder, text, [*cmd, *(f for f in flags if f != "-shared")])
    if _BUILT[folder] is None:
        return source
    return f'{source[:start]}#include "{_BUILT[folder]}"\n{source[start + len(text):]}'


def _build(folder: Path, text: str, cmd: list[str]) -> Path | None:
    """folder/prelude.h, put in place (by a rename) after its .gch: whoever finds the header finds
    both whole. None when gcc refuses or the folder is not writable."""
    if (folder / "prelude.h").exists() and (folder / "prelude.h.gch").exists():
        return folder / "prelude.h"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder, prefix=".tmp-"))
    except OSError:
        return None
    try:
        (tmp / "prelude.h").write_text(text + "\n")
        if subprocess.run([*cmd, "-x", "c-header", "-o", str(tmp / "prelude.h.gch"),
                           str(tmp / "prelude.h")], capture_output=True, check=False).returncode:
            return None
        for name in ("prelude.h.gch", "prelude.h"):
            os.replace(tmp / name, folder / name)
        return folder / "prelude.h"
    except OSError:
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
