"""The shared library of a C source: from the persistent cache, else compiled; and loading it.

Why apart from native.py: this part needs no torch (a child process of the cache tests imports it
in a fraction of a second), and it is the cubin cache's twin (runtime/cache.py, whose entry
format, checks and atomic writes it reuses rather than copies):
  entries  <user cache dir>/native/<key>.native: cache.py's 80-byte header (magic, key, length,
           sha256), then the library
  key      sha256 of FORMAT, the source, the compiler's resolved path, arguments and `--version`,
           the flags and this CPU's feature flags (the library is built with -march=native)
  damaged  an entry that fails the header check is logged, deleted and rebuilt, never an error
  racing   processes building one program at once each compile and write an identical entry
           (temp file, fsync, rename): the last rename wins, a reader sees none or a whole one
  off      STRATA_NO_CACHE=1 compiles every time and writes nothing
An entry is not loadable as it is (the header), so each load writes the library to a private
file, dlopens it and unlinks it (the mapping stays): no process maps a file another replaces, and
two programs of one source in one process are two independent libraries.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..core.user_cache import caching_enabled, user_cache_dir
from . import cache, cc

log = logging.getLogger("strata.native")

FORMAT = 1              # bump when the key record or the C ABI (strata_run) changes


def native_dir() -> Path:
    return user_cache_dir() / "native"


def cache_key(source: str, compiler: list[str]) -> str:
    record = {"format": FORMAT, "source": source, "compiler": cc.compiler_identity(compiler),
              "flags": list(cc.FLAGS + cc.LIBS), "cpu": cc.cpu_features()}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


_SOON: dict[str, Future] = {}      # sha256 of a source -> its build started by build_soon


def build_soon(source: str) -> None:
    """Start building `source` in a thread and return at once: the compiler is a process of its
    own, so a caller that goes on lowering the next program (models/decode.py) runs beside it on
    the other core. build_library(source) then waits for this build instead of starting another."""
    key = hashlib.sha256(source.encode()).hexdigest()
    if key not in _SOON:
        _SOON[key] = ThreadPoolExecutor(1).submit(_build, source)


def build_library(source: str) -> bytes:
    """The shared library of `source`: from the cache, else compiled (and cached)."""
    started = _SOON.pop(hashlib.sha256(source.encode()).hexdigest(), None) if _SOON else None
    return started.result() if started is not None else _build(source)


def _build(source: str) -> bytes:
    compiler = cc.find_compiler()
    if not caching_enabled():
        return cc.compile_shared(source, compiler)
    key = cache_key(source, compiler)
    path = native_dir() / f"{key}.native"
    image = cache._read(path, key)
    if image is not None:
        log.debug("hit %s", path)
        return image
    image = cc.compile_shared(source, compiler)
    cache._write(path, key, image)
    return image


def load_library(image: bytes) -> ctypes.CDLL:
    """dlopen a private copy of `image`, unlinked once loaded: in the native cache dir when it is
    writable, else the temp dir.

    The system libgomp it links reads OMP_WAIT_POLICY and GOMP_SPINCOUNT when it is first loaded
    (unless the user set them): passive, so that idle threads go to sleep instead of spinning on
    the cores that torch's own OpenMP pool (a second libgomp, bundled with torch) needs, but
    after 100000 spins, not at once: a decode step is hundreds of short kernels, and threads that
    fell asleep between them woke too late (TinyLlama Q4_0, 2 threads, Emerald Rapids: 20 to 23
    tokens/s with no spinning, 27 to 32 with 100000 spins, 25 to 30 with 300000, torch's default)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("GOMP_SPINCOUNT", "100000")
    for d in (native_dir(), Path(tempfile.gettempdir())):
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".load-", suffix=".so", dir=d)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(image)
            return ctypes.CDLL(name)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(name)
    raise OSError("no writable directory to load the compiled program from")
