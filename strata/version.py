"""strata's version, and the digest of its sources that keys what it caches: a module of its own,
so that what keys a cache by them (tune/db.py, models/compile_cache.py) or prints the version (the
CLI, the view's page) reads them without importing the package's facade (strata/__init__.py)."""
import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("strata")
except PackageNotFoundError:        # a source checkout on sys.path, not installed
    __version__ = "0+unknown"


def source_digest(root: Path = Path(__file__).resolve().parent) -> str:
    """The source under `root`: its Python and the C it emits from (preludes/*.h) or builds (*.c),
    so that an edited prelude is a new key, not a program built or a schedule measured with the
    old one."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".h", ".c")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()
