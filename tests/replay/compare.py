"""`python tests/replay/compare.py BEFORE AFTER`: compare two STRATA_REPLAY_LOG files (written by
two runs of the test suite) and exit 1 when a program lowered in both emits different code."""
import sys


def load(path: str) -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    with open(path) as f:
        for line in f:
            key, code = line.split()
            table.setdefault(key, set()).add(code)
    return table


def main(before: str, after: str) -> int:
    a, b = load(before), load(after)
    common = set(a) & set(b)
    changed = sorted(k for k in common if a[k] != b[k])
    print(f"programs: {len(a)} before, {len(b)} after, {len(common)} in both, "
          f"{len(changed)} with different code")
    for key in changed:
        print(f"  changed: {key}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
