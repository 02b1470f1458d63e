"""The tuning database: the best measured schedule of each kernel, on each target.

Why SQLite: several processes (a tune while a test suite compiles, two tunes on one machine) read
and write it at once; SQLite's locking (WAL journal, a busy timeout) makes that safe without a
lock file of our own, and `strata tune --show` is one query. A row is keyed by the kernel's
signature (loop/ir.py: its canonical Loop IR and buffer shapes), the target's name and strata's
version with a digest of its sources, so a new or edited compiler never applies an old
measurement. It lives at
<user cache dir>/tuning.sqlite; STRATA_NO_CACHE=1 neither reads nor writes it.
"""
from __future__ import annotations

import functools
import json
import sqlite3
import time
from pathlib import Path

from ..core.errors import StrataError
from ..core.user_cache import caching_enabled, user_cache_dir
from ..version import __version__, source_digest

SCHEMA = """CREATE TABLE IF NOT EXISTS tuned (
    signature TEXT NOT NULL, target TEXT NOT NULL, version TEXT NOT NULL,
    knobs TEXT NOT NULL,          -- JSON {NAME: value}: {} when the default schedule won
    label TEXT NOT NULL,          -- what the kernel computes, for --show
    default_ms REAL NOT NULL, tuned_ms REAL NOT NULL, candidates INTEGER NOT NULL,
    rejected TEXT NOT NULL,       -- JSON list of "knobs: why" for wrong, crashed or hung ones
    created REAL NOT NULL,
    other_load REAL,              -- share of the CPU other processes took while it was timed
    spread REAL,                  -- slowest / fastest schedule measured
    measured TEXT,                -- JSON [[knobs, ms, the default's ms in the same rounds], ...]
    stopped TEXT,                 -- why the search ended before its last candidate: "budget",
                                  -- "interrupted", or "minor" (under 2% of its program's kernel
                                  -- time: not searched); NULL: every candidate was tried
    untried TEXT,                 -- JSON [knobs, ...] of the candidates it did not get to
    PRIMARY KEY (signature, target, version))"""
ADDED = ("other_load REAL", "spread REAL", "measured TEXT", "stopped TEXT", "untried TEXT")   # columns an older database lacks


def db_path() -> Path:
    return user_cache_dir() / "tuning.sqlite"


@functools.cache
def compiler_version() -> str:
    """strata's version and a digest of its sources (C preludes too): an edited checkout is a new
    compiler, whose kernels are not the ones measured."""
    return f"{__version__}+{source_digest()[:12]}"


class TuningDB:
    """Lookups for the compiler (`get`) and records for the tuner (`put`, `rows`)."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path or db_path())
        self.version = compiler_version()
        self._cache: dict[tuple[str, str], dict | None] = {}

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=30)
        for attempt in range(200):      # switching to WAL does not wait for a busy lock itself
            try:
                if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    con.execute("PRAGMA journal_mode=WAL")
                con.execute(SCHEMA)
                have = {row[1] for row in con.execute("PRAGMA table_info(tuned)")}
                for column in ADDED:
                    if column.split()[0] not in have:
                        con.execute(f"ALTER TABLE tuned ADD COLUMN {column}")
                return con
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == 199:
                    raise
                time.sleep(0.05)
        return con

    def get(self, signature: str, target: str) -> dict | None:
        """The tuned knobs of a kernel ({} when its default won), or None when never tuned."""
        key = (signature, target)
        if key not in self._cache:
            if not self.path.exists():
                return None
            with self._connect() as con:
                row = con.execute("SELECT knobs FROM tuned WHERE signature=? AND target=? AND "
                                  "version=?", (signature, target, self.version)).fetchone()
            self._cache[key] = json.loads(row[0]) if row else None
        return self._cache[key]

    def put(self, signature: str, target: str, knobs: dict, label: str, default_ms: float,
            tuned_ms: float, candidates: int, rejected: list[str], other_load: float | None = None,
            spread: float | None = None, measured: list | None = None, stopped: str | None = None,
            untried: list | None = None) -> None:
        """`measured`: each candidate timed, as [knobs, ms, the default's ms in its rounds];
        `stopped` and `untried`: a search that ended early, and the candidates it left."""
        with self._connect() as con:
            con.execute("INSERT OR REPLACE INTO tuned (signature, target, version, knobs, label, "
                        "default_ms, tuned_ms, candidates, rejected, created, other_load, spread, "
                        "measured, stopped, untried) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (signature, target, self.version, json.dumps(knobs, sort_keys=True), label,
                         default_ms, tuned_ms, candidates, json.dumps(rejected), time.time(),
                         other_load, spread, None if measured is None else json.dumps(measured),
                         stopped, None if untried is None else json.dumps(untried)))
        self._cache[(signature, target)] = knobs

    def search(self, signature: str, target: str) -> dict | None:
        """How a kernel's search ended ({"stopped", "untried", "measured", "rejected", "tried",
        "default_ms"}),
        or None when it was never searched: what a later search goes on from."""
        if not self.path.exists():
            return None
        with self._connect() as con:
            row = con.execute("SELECT stopped, untried, measured, rejected, candidates, default_ms "
                              "FROM tuned "
                              "WHERE signature=? AND target=? AND version=?",
                              (signature, target, self.version)).fetchone()
        if row is None:
            return None
        stopped, untried, measured, rejected, tried, default_ms = row
        return {"stopped": stopped, "untried": json.loads(untried or "[]"),
                "measured": json.loads(measured or "[]"), "rejected": json.loads(rejected),
                "tried": tried, "default_ms": default_ms}

    def measurements(self, target: str) -> list[tuple[str, list, list, str]]:
        """(signature, measured, untried, label) of every search on `target`, of any strata
        version: how each knob's values ran on this machine, which the cost model learns from
        (calibrate.py)."""
        if not self.path.exists():
            return []
        with self._connect() as con:
            return [(sig, json.loads(m), json.loads(u or "[]"), label) for sig, m, u, label in
                    con.execute("SELECT signature, measured, untried, label FROM tuned WHERE "
                                "target=? AND measured IS NOT NULL", (target,))]

    def rows(self) -> list[dict]:
        """Every record of this strata version, the most recent first."""
        if not self.path.exists():
            return []
        with self._connect() as con:
            con.row_factory = sqlite3.Row
            return [dict(r) for r in con.execute(
                "SELECT * FROM tuned WHERE version=? ORDER BY created DESC", (self.version,))]


    def merge(self, rows: list[dict], replace: bool = False) -> tuple[int, int, int]:
        """Rows of an exported database into this one: (added, kept because a row of the same
        kernel and target was here, skipped because another strata version measured them: its
        kernels are not this one's). `replace`: an imported row wins over one already here. A row
        lacking a column the table requires is a StrataError naming it."""
        added = kept = skipped = 0
        with self._connect() as con:
            table = [(row[1], row[3]) for row in con.execute("PRAGMA table_info(tuned)")]
            columns = [name for name, _ in table]
            for r in rows:
                missing = [name for name, required in table if required and r.get(name) is None]
                if missing:
                    raise StrataError(f"a row to import has no {', '.join(missing)}: not a row "
                                      f"`strata tune --export` wrote")
                if r["version"] != self.version:
                    skipped += 1
                    continue
                here = con.execute("SELECT 1 FROM tuned WHERE signature=? AND target=? AND "
                                   "version=?", (r["signature"], r["target"], r["version"])).fetchone()
                if here and not replace:
                    kept += 1
                    continue
                con.execute(f"INSERT OR REPLACE INTO tuned ({', '.join(columns)}) VALUES "
                            f"({', '.join('?' * len(columns))})", [r.get(c) for c in columns])
                added += 1
        self._cache.clear()
        return added, kept, skipped


def default_db() -> TuningDB | None:
    """The database compiles consult, or None when caching is off."""
    return TuningDB() if caching_enabled() else None
