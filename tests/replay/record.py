"""`python -m tests.replay.record`: write baseline.json, the hash of every corpus program's CUDA
(run when a commit means to change the emitted code, and say so in its message)."""
import hashlib
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from corpus import cases  # noqa: E402

BASELINE = pathlib.Path(__file__).with_name("baseline.json")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def main() -> None:
    table = {}
    for name, emit in cases().items():
        table[name] = digest(emit())
        print(f"{name:48} {table[name]}", file=sys.stderr)
    BASELINE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(table)} hashes to {BASELINE}", file=sys.stderr)


if __name__ == "__main__":
    main()
