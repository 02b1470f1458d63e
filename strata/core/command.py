"""How every strata entry point (the `strata` command, `python -m strata.bench.*`) runs a command:
a user error is one sentence on stderr and its exit code, a bug one line, the traceback only with
--debug. Why a module of its own: the benchmarks sit below the CLI and share this with it."""
from __future__ import annotations

import os
import sys

from .errors import StrataError


def guarded(command, debug: bool) -> int:
    """Run `command()` and return its exit code (see the module docstring)."""
    try:
        return command()
    except StrataError as e:
        if debug:
            raise
        print(f"strata: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:          # `strata compile ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:   # a bug in strata: say so in one line, the traceback with --debug
        if debug:
            raise
        print(f"strata: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1
