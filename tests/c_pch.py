"""A compile cache for the C prelude, for the test run: every C program strata emits begins with
the same prelude (codegen/preludes/c_head.h: the libc headers, omp.h, immintrin.h), and parsing it
is nearly all of gcc's time on a small program (0.19 of 0.2 s). install() makes
runtime/cc.compile_shared compile that prefix once per run as a gcc precompiled header and each
program with its prelude replaced by `#include "<the prelude>"`: the same text by textual inclusion,
which is what gcc guarantees a precompiled header is (one it cannot use, it reads as the header),
and the library is byte for byte the plain compile's (tests/runtime/test_c_pch.py).
Only the tests' own process does this; the CLI and child processes the tests start compile as users
do. Not gcc (clang), or a source that does not begin with the prelude: compiled as it is."""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import strata

HEAD = Path(strata.__file__).parent / "codegen" / "preludes" / "c_head.h"     # the emitter's own


def install(directory: str) -> None:
    from strata.runtime import cc
    real = cc.compile_shared
    built: dict[str, Path | None] = {}

    def compile_shared(source: str, cmd: list[str]) -> bytes:
        span = _prelude(source)
        if span is None or not _is_gcc(tuple(cmd)):
            return real(source, cmd)
        start, end = span
        key = hashlib.sha256(repr((source[start:end], cmd, cc.FLAGS)).encode()).hexdigest()[:20]
        if key not in built or (built[key] is not None and not built[key].exists()):
            built[key] = _build(Path(directory) / "pch" / key, source[start:end], list(cmd),
                                cc.FLAGS)
        if built[key] is None:
            return real(source, cmd)
        return real(f'{source[:start]}#include "{built[key]}"\n{source[end:]}', cmd)

    compile_shared.plain = real
    cc.compile_shared = compile_shared


def _prelude(source: str) -> tuple[int, int] | None:
    """(start, end) of the prelude, if the source is comment lines (no C token: the kernels'
    names, kept in the program) and then the prelude."""
    head = HEAD.read_text() if HEAD.exists() else ""
    i = source.find(head) if head else -1
    if i < 0 or any(line.strip() and not line.startswith("//") for line in source[:i].splitlines()):
        return None
    return i, i + len(head)


_GCC: dict[tuple, bool] = {}


def _is_gcc(cmd: tuple) -> bool:
    if cmd not in _GCC:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, check=False)
        _GCC[cmd] = "Free Software Foundation" in out.stdout and "clang" not in out.stdout
    return _GCC[cmd]


def _build(folder: Path, prefix: str, cmd: list[str], flags) -> Path | None:
    """folder/prelude.h (the prefix) and its .gch, written by whichever worker comes first (each
    file by rename: a reader finds none or a whole one; the header alone is read as text)."""
    header, pch = folder / "prelude.h", folder / "prelude.h.gch"
    if header.exists() and pch.exists():
        return header
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=".tmp-"))
    (tmp / "prelude.h").write_text(prefix)
    res = subprocess.run([*cmd, *(f for f in flags if f != "-shared"), "-x", "c-header",
                          "-o", str(tmp / "prelude.h.gch"), str(tmp / "prelude.h")],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return None
    os.replace(tmp / "prelude.h.gch", pch)
    os.replace(tmp / "prelude.h", header)
    tmp.rmdir()
    return header
