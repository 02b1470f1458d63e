"""A persistent cache of NVRTC output, so that a program compiled once is not compiled again by a
later process (NVRTC costs tens of milliseconds per kernel, a whole model's worth adds up).

  where   $STRATA_CACHE_DIR, else $XDG_CACHE_HOME/strata, else ~/.cache/strata; entries in kernels/
  key     sha256 of a JSON record: FORMAT, the source text, arch, want, the kernel names (they name
          the translation unit, which -lineinfo writes into the cubin), the NVRTC version, the NVRTC
          options less their -I<dir> paths, and the sha256 of each header the source #includes, as
          found in those dirs. The paths are left out so that a key does not depend on where CUDA
          or the virtualenv is installed (another venv, a container, a shared cache dir all hit);
          the header contents stand in for them, so headers upgraded in place still miss.
  entry   kernels/<key>.<want>: an 80-byte header (magic, key, payload length, payload sha256),
          then the cubin or PTX. A truncated or damaged entry fails the check, is logged, deleted
          and rebuilt; it is never an error.
  writes  to a temp file in kernels/, fsync, os.replace: a reader sees no entry or a whole one.
          Processes compiling the same program at once each compile and write an identical entry;
          the last rename wins (no locks: a duplicate compile is cheaper than a stuck lock).
  no dir  a cache dir that cannot be created or written logs one warning, and compilation goes on
          without the cache.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import struct
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from ..core.user_cache import caching_enabled, user_cache_dir
from . import nvrtc

log = logging.getLogger("strata.cache")

FORMAT = 1                                 # bump when the key record or the entry layout changes
MAGIC = b"STRATAK\x01"
HEADER = struct.Struct("<8s32sQ32s")       # magic, key, payload length, payload sha256
WANTS = ("cubin", "ptx")
_TMP = ".tmp-"                             # prefix of files being written
_STALE_TMP_S = 3600                        # clear_cache leaves younger temp files to their writers
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.MULTILINE)
_warned: set[str] = set()


def cache_dir() -> Path:
    """The user cache directory (strata/core/user_cache.py); read on every call, so a test or a CLI
    flag can point it elsewhere."""
    return user_cache_dir()


def kernels_dir() -> Path:
    return cache_dir() / "kernels"


def cache_key(source: str, arch: str = "sm_90", kernel_names=(), want: str = "cubin") -> str:
    """The hex sha256 naming the entry for this compile (see the module docstring)."""
    opts = nvrtc.options(arch)
    dirs = tuple(o[2:] for o in opts if o.startswith("-I"))
    record = {
        "format": FORMAT, "source": source, "arch": arch, "want": want,
        "kernel_names": [str(n) for n in kernel_names],
        "nvrtc": list(nvrtc.nvrtc_version()),
        "options": [o for o in opts if not o.startswith("-I")],
        "headers": {name: _header_digest(name, dirs) for name in _INCLUDE_RE.findall(source)},
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def compile_cached(source: str, arch: str = "sm_90", kernel_names=(), want: str = "cubin") -> bytes:
    """nvrtc.compile_cuda through the cache: the same bytes, NVRTC only on a miss."""
    if want not in WANTS:
        raise ValueError(f"want must be 'cubin' or 'ptx', not {want!r}")
    if not caching_enabled():
        return nvrtc.compile_cuda(source, arch, kernel_names, want)
    key = cache_key(source, arch, kernel_names, want)
    path = kernels_dir() / f"{key}.{want}"
    image = _read(path, key)
    if image is not None:
        log.debug("hit %s", path)
        return image
    image = nvrtc.compile_cuda(source, arch, kernel_names, want)
    _write(path, key, image)
    return image


def cache_info() -> dict:
    """{"dir": the cache dir, "entries": kernel entries, "bytes": their total size}."""
    sizes = [st.st_size for e, st in _scan() if _is_entry(e.name)]
    return {"dir": str(cache_dir()), "entries": len(sizes), "bytes": sum(sizes)}


def clear_cache() -> int:
    """Delete every kernel entry (and temp files left by killed writers); return how many
    entries went."""
    removed = 0
    for e, st in _scan():
        stale = e.name.startswith(_TMP) and time.time() - st.st_mtime > _STALE_TMP_S
        if _is_entry(e.name) or stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
                removed += _is_entry(e.name)
    return removed


def check_entry(data: bytes, key: str) -> tuple[bytes | None, str]:
    """(payload, "") for a sound entry written for `key`, else (None, what is wrong)."""
    if len(data) < HEADER.size:
        return None, f"{len(data)} bytes, shorter than the {HEADER.size}-byte header"
    magic, k, n, digest = HEADER.unpack_from(data)
    payload = data[HEADER.size:]
    if magic != MAGIC:
        return None, "bad magic"
    if k != bytes.fromhex(key):
        return None, "written for another key"
    if len(payload) != n:
        return None, f"payload is {len(payload)} bytes, the header says {n}"
    if hashlib.sha256(payload).digest() != digest:
        return None, "checksum mismatch"
    return payload, ""


def _read(path: Path, key: str) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.debug("cannot read %s (%s): a miss", path, e)
        return None
    payload, why = check_entry(data, key)
    if payload is None:
        log.warning("corrupt kernel cache entry %s (%s); rebuilding it", path, why)
        with contextlib.suppress(OSError):
            path.unlink()
    return payload


def _write(path: Path, key: str, image: bytes) -> None:
    data = HEADER.pack(MAGIC, bytes.fromhex(key), len(image), hashlib.sha256(image).digest())
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_TMP, dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data + image)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        if str(path.parent) not in _warned:
            _warned.add(str(path.parent))
            log.warning("kernel cache %s is not writable (%s); compiling without it",
                        path.parent, e)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@lru_cache(maxsize=64)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _header_digest(name: str, dirs: tuple[str, ...]) -> str | None:
    """sha256 of the first `name` in `dirs`; None for a header NVRTC supplies itself (its version
    is in the key)."""
    for d in dirs:
        p = Path(d, name)
        with contextlib.suppress(OSError):
            st = p.stat()
            return _file_digest(str(p), st.st_mtime_ns, st.st_size)
    return None


def _scan() -> list[tuple[os.DirEntry, os.stat_result]]:
    """The files in kernels/ with their stat (one that vanishes meanwhile is left out)."""
    found = []
    with contextlib.suppress(OSError), os.scandir(kernels_dir()) as it:   # OSError: no cache yet
        for e in it:
            with contextlib.suppress(OSError):
                if e.is_file(follow_symlinks=False):
                    found.append((e, e.stat(follow_symlinks=False)))
    return found


def _is_entry(name: str) -> bool:
    stem, _, want = name.partition(".")
    return want in WANTS and len(stem) == 64 and not name.startswith(_TMP)
