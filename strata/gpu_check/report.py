"""The acceptance run's report: one `Step` per step, written as markdown and JSON and the logs
packed into one archive after every step, so a run cut off by its time limit loses nothing it
measured. At most three files land in the output folder."""
from __future__ import annotations

import json
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.user_cache import write_atomically

REPORT_MD, REPORT_JSON, LOGS = "gpu_check.md", "gpu_check.json", "gpu_check_logs.tar.gz"
STATUSES = ("pass", "fail", "timeout", "skipped", "dry-run")


@dataclass
class Step:
    name: str
    status: str = "skipped"        # one of STATUSES
    seconds: float = 0.0
    summary: str = ""              # one line
    details: list[str] = field(default_factory=list)     # markdown lines
    command: str = ""


@dataclass
class Report:
    title: str
    facts: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"# {self.title}", ""]
        lines += [f"- {k}: {v}" for k, v in self.facts.items()]
        lines += ["", "| step | status | seconds | summary |", "| --- | --- | --- | --- |"]
        lines += [f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.summary} |" for s in self.steps]
        for s in self.steps:
            lines += ["", f"## {s.name}: {s.status}", ""]
            if s.command:
                lines += [f"`{s.command}`", ""]
            lines += s.details or [s.summary]
        return "\n".join(lines) + "\n"

    def write(self, out: Path, logs: Path) -> None:
        """Rewrite the report and the log archive in `out` (whole files, replaced atomically)."""
        out.mkdir(parents=True, exist_ok=True)
        write_atomically(out / REPORT_MD, self.markdown().encode())
        write_atomically(out / REPORT_JSON, json.dumps(asdict(self), indent=1).encode())
        tmp = out / (LOGS + ".tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            for f in sorted(logs.rglob("*")):
                if f.is_file():
                    tar.add(f, arcname=str(f.relative_to(logs)))
        tmp.replace(out / LOGS)

