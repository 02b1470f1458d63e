"""The ways of running one program that a benchmark compares: eager, torch.compile (default and
max-autotune-no-cudagraphs) and strata, each prepared and timed in turn.

A variant that cannot be prepared or timed becomes a row saying why ("failed: <reason>", or the
status strata's compile left, e.g. "unsupported: <sentence>"), and the run goes on. Dynamo's
caches are reset before each torch.compile, so shapes from earlier cases never make it recompile
with dynamic shapes or hit its recompile limit (which silently falls back to eager).
"""
from __future__ import annotations

from ..core.errors import StrataError, UnsupportedOp
from .results import EAGER, MAX_AUTOTUNE, STRATA, TORCH_COMPILE, VARIANTS, VariantRow

COMPILE_MODES = {TORCH_COMPILE: None, MAX_AUTOTUNE: "max-autotune-no-cudagraphs"}
MAX_REASON = 200


def reason(e: BaseException) -> str:
    """One line for an exception: its first meaningful line (joined with the next when it only
    introduces it, as in "backend='inductor' raised:"), prefixed by the type."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()
             and not ln.strip().startswith(("Set TORCHDYNAMO", "You can suppress", "For even more"))]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "…"


def strata_status(e: BaseException) -> str:
    """The strata row's status for a compile that raised."""
    if isinstance(e, UnsupportedOp):
        return f"unsupported: {e}"
    if isinstance(e, StrataError):
        return f"failed: {e}"
    return f"failed: internal error: {reason(e)}"


def torch_compile(fn, mode):
    """torch.compile with fresh dynamo caches and static shapes (tests replace this)."""
    import torch
    torch._dynamo.reset()
    return torch.compile(fn, mode=mode, dynamic=False)


def _synchronize() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def prepare(name: str, fn, inputs, program=None):
    """The callable for variant `name`, called once (compiling it if needed)."""
    import torch
    if name == EAGER:
        call = fn
    elif name in COMPILE_MODES:
        call = torch_compile(fn, COMPILE_MODES[name])
    elif name == STRATA:
        call = program
    else:
        raise ValueError(f"unknown variant {name!r}")
    with torch.no_grad():
        call(*inputs)
    _synchronize()
    return call


def measure_variants(fn, arg_sets, timer, program=None, strata_status_text: str = "ok",
                     which=VARIANTS, on_step=None) -> list[VariantRow]:
    """Prepare and time each variant in `which`. timer(call, arg_sets) -> Timing.
    program None: the strata row carries `strata_status_text` (why it did not compile)."""
    rows = []
    for name in which:
        if name == STRATA and program is None:
            rows.append(VariantRow(STRATA, strata_status_text))
            continue
        if on_step:
            on_step(f"preparing {name}")
        try:
            call = prepare(name, fn, arg_sets[0], program)
        except Exception as e:  # noqa: BLE001 - a failing variant is a row, the run goes on
            rows.append(VariantRow(name, f"failed: {reason(e)}"))
            continue
        if on_step:
            on_step(f"timing {name}")
        try:
            rows.append(VariantRow(name, "ok", timer(call, arg_sets)))
        except Exception as e:  # noqa: BLE001 - likewise
            rows.append(VariantRow(name, f"failed: {reason(e)}"))
    return rows
