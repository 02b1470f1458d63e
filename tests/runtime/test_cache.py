"""The kernel cache: a later process compiles nothing, keys separate what differs, damaged entries
are rebuilt, concurrent writers leave one sound entry, an unwritable dir only costs the cache."""
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
from racing_children import race

pytest.importorskip("cuda.bindings.nvrtc")

from strata.runtime import cache, nvrtc  # noqa: E402


SOURCE = """#include <cuda_fp16.h>
extern "C" __global__ void k_scale_{salt}(const __half* x, float* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * __half2float(x[i]);
}}
"""

def source(salt="a"):
    return SOURCE.format(salt=salt)


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("STRATA_CACHE_DIR", str(d))
    return d


def compiles(fn, *args, **kw):
    """(result of fn, NVRTC compiles it made in this process)."""
    before = nvrtc.COMPILES
    out = fn(*args, **kw)
    return out, nvrtc.COMPILES - before


def children(tmp_path, src, n):
    """n processes compiling `src` through the cache at the same moment: (compiles, sha256)."""
    return race(tmp_path, src, n, "from strata.runtime import cache, nvrtc",
                'cache.compile_cached(src, "sm_90")', "nvrtc.COMPILES", timeout=60)


def test_a_second_process_compiles_nothing(tmp_path):
    src = source("first")
    image, n = compiles(cache.compile_cached, src, "sm_90")
    assert n == 1 and image[:4] == b"\x7fELF"
    [(child_compiles, digest)] = children(tmp_path, src, 1)
    assert child_compiles == 0
    assert digest == hashlib.sha256(image).hexdigest()


def test_hit_returns_the_same_bytes_as_nvrtc():
    src = source()
    for want in ("cubin", "ptx"):
        first, n1 = compiles(cache.compile_cached, src, "sm_80", want=want)
        again, n2 = compiles(cache.compile_cached, src, "sm_80", want=want)
        assert (n1, n2) == (1, 0)
        assert first == again == nvrtc.compile_cuda(src, "sm_80", want=want)


def test_nvrtc_leaves_the_interpreter_intact():
    """NVRTC once wrote its empty log into CPython's shared one-byte b" ", so that every later
    space printed as NUL (it garbled the children's output above)."""
    nvrtc.compile_cuda('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "sm_90")
    assert b" "[0] == 32 and " ".encode()[0] == 32   # noqa: UP012 (the encoder path, on purpose)


def test_keys_separate_arch_source_want_and_names():
    key = cache.cache_key(source(), "sm_90")
    assert key == cache.cache_key(source(), "sm_90", (), "cubin")
    others = [cache.cache_key(source(), "sm_80"), cache.cache_key(source("b"), "sm_90"),
              cache.cache_key(source(), "sm_90", want="ptx"),
              cache.cache_key(source(), "sm_90", kernel_names=("k_other",))]
    assert len({key, *others}) == 5


def test_keys_follow_header_contents_not_include_paths(tmp_path, monkeypatch):
    key = cache.cache_key(source(), "sm_90")
    [real] = [d for d in nvrtc.include_dirs() if Path(d, "cuda_fp16.h").is_file()][:1]
    moved = tmp_path / "elsewhere" / "include"
    moved.mkdir(parents=True)
    shutil.copy(Path(real, "cuda_fp16.h"), moved)               # the one header SOURCE includes
    monkeypatch.setattr(nvrtc, "include_dirs", lambda: (str(moved),))
    assert cache.cache_key(source(), "sm_90") == key            # same headers, another path
    with open(moved / "cuda_fp16.h", "a") as f:
        f.write("\n// patched\n")
    assert cache.cache_key(source(), "sm_90") != key            # same path, other headers


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "flipped", "other key"])
def test_a_damaged_entry_is_rebuilt(damage, caplog):
    src = source()
    fresh = nvrtc.compile_cuda(src, "sm_90")
    cache.compile_cached(src, "sm_90")
    [entry] = cache.kernels_dir().iterdir()
    data = entry.read_bytes()
    entry.write_bytes({
        "truncated": data[:len(data) // 2],
        "garbage": os.urandom(len(data)),
        "empty": b"",
        "flipped": data[:-1] + bytes([data[-1] ^ 1]),
        "other key": data[:8] + bytes(32) + data[40:],
    }[damage])
    with caplog.at_level(logging.WARNING, logger="strata.cache"):
        image, n = compiles(cache.compile_cached, src, "sm_90")
    assert n == 1 and image == fresh
    assert "corrupt kernel cache entry" in caplog.text
    assert entry.read_bytes() == data                            # rebuilt as it was
    assert compiles(cache.compile_cached, src, "sm_90") == (fresh, 0)


def test_concurrent_processes_leave_one_sound_entry(tmp_path):
    src = source("race")
    results = children(tmp_path, src, 4)
    assert len({digest for _, digest in results}) == 1
    assert sum(count for count, _ in results) >= 1
    [entry] = cache.kernels_dir().iterdir()                      # no temp files left behind
    key = cache.cache_key(src, "sm_90")
    assert entry.name == f"{key}.cubin"
    payload, why = cache.check_entry(entry.read_bytes(), key)
    assert why == "" and hashlib.sha256(payload).hexdigest() == results[0][1]
    assert compiles(cache.compile_cached, src, "sm_90") == (payload, 0)


def test_an_unwritable_cache_dir_still_compiles(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("STRATA_CACHE_DIR", str(blocker / "cache"))
    src = source()
    with caplog.at_level(logging.WARNING, logger="strata.cache"):
        first, n1 = compiles(cache.compile_cached, src, "sm_90")
        _, n2 = compiles(cache.compile_cached, src, "sm_80")
    assert (n1, n2) == (1, 1)
    assert first == nvrtc.compile_cuda(src, "sm_90")
    assert caplog.text.count("is not writable") == 1             # warned once
    assert cache.cache_info()["entries"] == 0 and cache.clear_cache() == 0


def test_info_and_clear(cache_in_tmp):
    assert cache.cache_info() == {"dir": str(cache_in_tmp), "entries": 0, "bytes": 0}
    assert cache.clear_cache() == 0
    cache.compile_cached(source(), "sm_80")
    cache.compile_cached(source(), "sm_90", want="ptx")
    d = cache.kernels_dir()
    stale, live = d / ".tmp-stale", d / ".tmp-live"
    stale.write_bytes(b"x")
    live.write_bytes(b"y")
    os.utime(stale, (time.time() - 7200,) * 2)
    info = cache.cache_info()
    assert info["entries"] == 2
    assert info["bytes"] == sum(p.stat().st_size for p in d.iterdir() if p.name[0] != ".")
    assert cache.clear_cache() == 2
    assert cache.cache_info()["entries"] == 0
    assert not stale.exists() and live.exists()                  # a writer may still own it
    assert compiles(cache.compile_cached, source(), "sm_80")[1] == 1


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STRATA_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "strata"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "strata"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "strata"
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.cache_dir() == tmp_path / "mine"
