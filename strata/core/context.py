"""What every stage and pass receives besides its IR: verbosity, the log, and schedule knobs.

Passes never print; they call `ctx.log(...)` (shown at -v) and read knobs with
`ctx.knob(name, default)`, which the user pins with `--knob NAME=VALUE` or `STRATA_KNOBS`; every
knob is registered, with its allowed values, in strata/core/knobs.py.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace

from .errors import KnobError
from .knobs import KNOBS, parse
from .targets import DEFAULT, Target, get_target


def _env_knobs() -> dict[str, object]:
    out = {}
    for part in filter(None, (p.strip() for p in os.environ.get("STRATA_KNOBS", "").split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise KnobError(f"STRATA_KNOBS: {part!r} is not NAME=VALUE")
        out.update([parse(name, value, "STRATA_KNOBS")])
    return out


@dataclass
class Context:
    verbosity: int = 0
    knobs: dict[str, object] = field(default_factory=dict)   # NAME -> typed value (strata/core/knobs.py)
    target: Target | str | None = None   # pinned target (a name is looked up); None: see `arch`
    messages: list[str] = field(default_factory=list)
    stream: object = None            # where log lines go at -v (default stderr)
    # per-kernel knobs, keyed by the Loop IR kernel's signature (loop/ir.py `signature`): the
    # tuner's candidate (kernel_knobs), else what `tuned.get(signature, target)` recorded
    # (strata/tune/db.py's database; False: --no-tuned); the user's pins always win
    kernel_knobs: dict[str, dict] = field(default_factory=dict)
    tuned: object = None

    def __post_init__(self):
        """Check every pin here, whichever way it came (--knob, STRATA_KNOBS, torch.compile's
        options, --target), so a bad one is one sentence before any pass runs."""
        self.knobs = {**_env_knobs(), **dict(parse(k, v) for k, v in self.knobs.items())}
        if self.target is not None:
            self.target = get_target(self.target)

    @property
    def arch(self) -> Target:
        """The Target passes compile for: the pinned one, else targets.DEFAULT (the api fills
        `target` from the GPU itself when a program is compiled to run on one)."""
        return self.target or DEFAULT

    def log(self, msg: str, level: int = 1) -> None:
        self.messages.append(msg)
        if self.verbosity >= level:
            print(msg, file=self.stream or sys.stderr)

    def for_kernel(self, signature: str) -> tuple["Context", str]:
        """(the context one kernel is scheduled with, where its extra knobs came from: "" for
        none, "candidate" or "tuned")."""
        extra, source = self.kernel_knobs.get(signature), "candidate"
        if extra is None and self.tuned:
            extra, source = self.tuned.get(signature, self.arch.key), "tuned"
        if not extra:
            return self, ""
        return replace(self, knobs={**extra, **self.knobs}), source

    def knob(self, name: str, default):
        """A knob's value: the user's pin if any (already checked and typed), else default."""
        assert name in KNOBS, f"knob {name} is not registered in strata/core/knobs.py"
        return self.knobs.get(name, default)

    def pinned(self, name: str) -> bool:
        """Did the user pin it? (A pinned knob that a pass consults shows in the kernel header.)"""
        assert name in KNOBS, f"knob {name} is not registered in strata/core/knobs.py"
        return name in self.knobs
