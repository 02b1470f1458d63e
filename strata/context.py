"""What every stage and pass receives besides its IR: verbosity, the log, and schedule knobs.

Passes never print; they call `ctx.log(...)` (shown at -v) and read knobs with
`ctx.knob(name, default)`, which the user pins with `--knob NAME=VALUE` or `STRATA_KNOBS`.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field


def _env_knobs() -> dict[str, str]:
    raw = os.environ.get("STRATA_KNOBS", "")
    out = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        name, _, value = part.partition("=")
        out[name.strip().upper()] = value.strip()
    return out


DEFAULT_TARGET = "sm_90"     # what `strata compile` emits for when no GPU and no --target says otherwise


@dataclass
class Context:
    verbosity: int = 0
    knobs: dict[str, str] = field(default_factory=dict)
    target: str | None = None        # GPU architecture; None: see `arch`
    messages: list[str] = field(default_factory=list)
    stream: object = None            # where log lines go at -v (default stderr)

    def __post_init__(self):
        self.knobs = {**_env_knobs(), **{k.upper(): v for k, v in self.knobs.items()}}

    @property
    def arch(self) -> str:
        """The architecture passes compile for: the pinned target, else DEFAULT_TARGET (the api
        fills `target` from the GPU itself when a program is compiled to run on one)."""
        return self.target or DEFAULT_TARGET

    def log(self, msg: str, level: int = 1) -> None:
        self.messages.append(msg)
        if self.verbosity >= level:
            print(msg, file=self.stream or sys.stderr)

    def knob(self, name: str, default):
        """A knob's value: the user's pin if any (converted to the default's type), else default."""
        raw = self.knobs.get(name.upper())
        if raw is None:
            return default
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        return raw
