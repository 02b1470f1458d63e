"""Run an attention program through every stage and the simulator (also the sanitizer) and
compare with eager float64; attention must be one fused kernel."""
from conftest import run_and_compare

from strata.context import Context


def check_fused(fn, inputs, knobs=None):
    """fn through the simulator vs eager float64 (DESIGN.md tolerances); returns the Program."""
    prog = run_and_compare(fn, inputs, contraction=True, ctx=Context(knobs=dict(knobs or {})))
    kernels = prog.lowered.kernel.kernels
    assert len(kernels) == 1, [k.name for k in kernels]
    assert prog.lowered.tile.kernels[0].mode == "attention"
    return prog
