"""The hot loop of each kernel, and what llvm-mca says it costs on the target's CPU.

Why: a schedule for a CPU strata is not running on (an AMX Xeon, a Zen 4, a Neoverse) cannot be
timed, but its machine code can be: `--ir asm` heads each kernel with its innermost loop that
does the most vector arithmetic (the micro-kernel, or a row's vector loop), how many
instructions and vector FMAs it holds, and llvm-mca's cycles per iteration for the target's
-mcpu (Debian's llvm; without it the line says so). The loop is fed to llvm-mca as objdump
printed it, addresses and relocations taken out and the back edge pointed at a label.
"""
from __future__ import annotations

import re
import shutil
import subprocess

_LINE = re.compile(r"^\s*([0-9a-f]+):\s+(\S.*)$")
_BRANCH = re.compile(r"^(j\w+|b\.\w+|b|cbn?z|tbn?z|b(?:eq|ne|lt|ge|gt|le)(?:u|z)?|bnez|beqz|bgez|blez|"
                     r"bgtz|bltz)(\s+(?:.*,\s*)?)([0-9a-f]+)\s+<.*$")     # x86, aarch64, RISC-V
_COMMENT = re.compile(r"\s+(#\s.*|//.*)$")      # objdump's x86 `# 0x...` and aarch64 `// ...`
_VECTOR_MATH = re.compile(r"^(vfn?m(?:add|sub)\w*ps|vdpbf16ps|vpdpbusds?|tdp\w+|fn?mla\b|"
                          r"bfdot|bfmmla|sdot|udot|v(?:add|mul|sub|max|min)ps|"
                          r"vfn?mac\w*|vfn?madd\.\w+|vf(?:add|mul|sub|max|min)\.\w+|"
                          r"fn?madd\.s|f(?:add|mul|max|min)\.s)")     # (RISC-V: vector, then scalar)
_FMA = re.compile(r"^(vfn?madd\w*ps|vdpbf16ps|vpdpbusds?|tdp\w+|fmla|bfdot|bfmmla|sdot|udot|"
                  r"vfn?mac\w*|vfn?madd\.\w+|fn?madd\.s)")
# llvm-mca's name of each target's CPU (x86-64-v3 is no CPU to it: Haswell is that ISA level)
_MCPU = {"x86-64": "x86-64", "x86-64-v3": "haswell", "znver3": "znver3",
         "sapphirerapids": "sapphirerapids", "neoverse-v1": "neoverse-v1",
         "rv64gcv": "sifive-u74"}                   # (LLVM 14 has no RISC-V vector core model)


def hot_loop(function_asm: str) -> list[str]:
    """The instructions of the innermost backward-branch loop with the most vector math (the
    first of equals), without addresses; [] when the function has no such loop."""
    rows = [(int(m[1], 16), _COMMENT.sub("", m[2]).strip()) for m in map(_LINE.match,
            function_asm.splitlines()) if m and not m[2].startswith("R_")]
    row_at = {a: j for j, (a, _) in enumerate(rows)}
    target = [row_at.get(int(m[3], 16), -1) if (m := _BRANCH.match(t)) else -1 for _, t in rows]
    best: list[str] = []
    for i, start in enumerate(target):
        if not 0 <= start < i:
            continue                                    # not a back edge
        body = [t for _, t in rows[start:i + 1]]
        inner = not any(start <= target[j] < j for j in range(start, i))   # no loop inside
        if inner and _score(body) > _score(best):
            best = body
    return best


def _score(body: list[str]) -> int:
    """Vector math in `body`, an AMX tile op (16x16x32 products) counting as 256 zmm FMAs."""
    return sum(256 if t.startswith("tdp") else 1 for t in body if _VECTOR_MATH.match(t))


def summary(name: str, body: list[str], target) -> str:
    """One comment line: the hot loop's size, its vector FMAs and llvm-mca's cycles."""
    if not body:
        return f"// {name}: no loop"
    tiles = sum(t.startswith("tdp") for t in body)
    scalar = sum(bool(re.match(r"fn?madd\.s", t)) for t in body)
    fmas = sum(bool(_FMA.match(t)) for t in body) - tiles - scalar
    math = ", ".join([f"{fmas} vector FMAs"] + [f"{tiles} AMX tile products"] * bool(tiles)
                     + [f"{scalar} scalar FMAs"] * bool(scalar))
    cycles, why = cycles_per_iteration(body, target)
    cost = f"{cycles:.2f} cycles an iteration on {mcpu(target)} (llvm-mca)" if cycles is not None \
        else why
    return f"// {name}: hot loop of {len(body)} instructions, {math}: {cost}"


# a CPU a newer LLVM knows by its own name: (its -mcpu, the first LLVM that has it)
NEWER = {"cpu-znver4": ("znver4", 16)}


def llvm_mca() -> tuple[str | None, int]:
    """The newest llvm-mca installed (Debian's llvm-19 knows Zen 4; llvm's default, 14 on
    bookworm, does not) and its major version; (None, 0) without one."""
    for version in range(30, 13, -1):
        if exe := shutil.which(f"llvm-mca-{version}"):
            return exe, version
    exe = shutil.which("llvm-mca")
    return exe, 0


def mcpu(target) -> str:
    """llvm-mca's -mcpu for the target's CPU."""
    if target.isa == "native":
        return "native"
    name, since = NEWER.get(target.name, ("", 0))
    return name if name and llvm_mca()[1] >= since else _MCPU.get(target.isa, target.isa)


def cycles_per_iteration(body: list[str], target) -> tuple[float | None, str]:
    """(llvm-mca's cycles per iteration of `body` on the target's CPU, "") or (None, why not)."""
    exe, _ = llvm_mca()
    if exe is None:
        return None, "llvm-mca not installed (apt-get install llvm)"
    lines = ["strata_loop:"] + [_BRANCH.sub(lambda m: f"{m[1]}{m[2]}strata_loop", t) for t in body]
    triple = f"{target.machine or 'x86_64'}-linux-gnu"
    iterations = 100
    try:
        res = subprocess.run([exe, f"-mtriple={triple}", f"-mcpu={mcpu(target)}",
                              f"-iterations={iterations}"], input="\n".join(lines) + "\n",
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"llvm-mca did not run ({e})"
    m = re.search(r"Total Cycles:\s+(\d+)", res.stdout)
    if res.returncode == 0 and m and "error:" not in res.stderr:    # (it skips what it cannot
        return int(m[1]) / iterations, ""                          # parse, and prices the rest)
    error = next((ln for ln in res.stderr.splitlines() if "error:" in ln), res.stderr.strip()[:200])
    lines = res.stderr.splitlines()            # the instruction follows its error (or its note)
    which = next((lines[j + 1] for j, ln in enumerate(lines[:-1]) if "error:" in ln), "")
    which = which.split("instruction:")[-1].split()
    return None, (f"llvm-mca cannot model it on {mcpu(target)}: "
                  f"{error.split('error:')[-1].strip().rstrip('.')}" + (f" ({which[0]})" if which else ""))
