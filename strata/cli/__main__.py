"""`python -m strata.cli ...`: the `strata` command (strata/cli/__init__.py)."""
import sys

from . import main

sys.exit(main())
