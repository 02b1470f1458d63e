"""strata's version: a module of its own, so that what keys a cache by it (tune/db.py) or prints it
(the CLI, the view's page) reads it without importing the package's facade (strata/__init__.py)."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("strata")
except PackageNotFoundError:        # a source checkout on sys.path, not installed
    __version__ = "0+unknown"
