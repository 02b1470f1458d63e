"""The compiler core's line budget: print the non-blank lines of each stage and fail (exit 1)
when one is over the budget written in .ci/line_budget.json. Why: a compiler that stays
readable is one whose stages stay small; growing a stage is a decision, made by raising its
budget in the same commit. Run by .ci/run and by tests/test_line_budget.py."""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUDGET = pathlib.Path(__file__).with_name("line_budget.json")
# stage -> the files it is made of (globs under strata/)
STAGES = {
    "frontend (Torch IR)": ["frontend/*.py"],
    "tensor (Tensor IR)": ["tensor/*.py"],
    "loop (Loop IR, fusion)": ["loop/*.py"],
    "tile (schedules)": ["tile/*.py", "tile/passes/*.py"],
    "kernel_ir (Kernel IR, lowering, simulator)": ["kernel_ir/*.py"],
    "codegen (emitters)": ["codegen/*.py"],
    "runtime": ["runtime/*.py"],
    "dsl (@strata.kernel front end)": ["dsl/*.py"],
    "shared (pipeline, expr, scalar ops, targets, knobs)": [
        "pipeline.py", *(f"core/{m}.py" for m in ("expr", "scalar_ops", "dtypes", "targets", "knobs",
                                                   "context", "errors", "operands"))],
}


def count(globs) -> int:
    files = sorted({p for g in globs for p in (ROOT / "strata").glob(g)})
    return sum(1 for p in files for line in p.read_text().splitlines() if line.strip())


def main() -> int:
    budget = json.loads(BUDGET.read_text())
    over = []
    print(f"{'stage':55} {'lines':>7} {'budget':>7}")
    for stage, globs in STAGES.items():
        n, limit = count(globs), budget[stage]
        print(f"{stage:55} {n:7d} {limit:7d}{'  OVER' if n > limit else ''}")
        if n > limit:
            over.append(stage)
    total = sum(count(g) for g in STAGES.values())
    print(f"{'total':55} {total:7d} {sum(budget[s] for s in STAGES):7d}")
    c_text = sum(1 for p in (ROOT / "strata/codegen/preludes").glob("*.h")
                 for line in p.read_text().splitlines() if line.strip())
    print(f"{'(not counted: C helper text in codegen/preludes/*.h)':55} {c_text:7d}")
    if over:
        print(f"over budget: {', '.join(over)} (raise .ci/line_budget.json in the commit that "
              f"means it)", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
