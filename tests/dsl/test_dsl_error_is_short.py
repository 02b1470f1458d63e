"""A kernel that reads out of bounds on the simulator fails at the user's launch line with the
simulator's sentence, not 30 lines of simulator frames (issue 29); STRATA_DEBUG=1 shows them."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch, strata as st
    @st.kernel
    def shifted(x, out, n: int):
        i = st.program_id(0) * 32 + st.thread_id(0)
        out[i] = x[i + 1]
    x, out = torch.randn(64), torch.empty(64)
    shifted[2, 32](x, out, 64, device="sim")
""")


def _run(tmp_path, **env):
    path = tmp_path / "oob.py"
    path.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}).stderr.strip().splitlines()


def test_out_of_bounds_on_the_simulator_is_the_sentence_at_the_launch(tmp_path):
    err = _run(tmp_path)
    assert err[-1].startswith("strata.core.errors.SimError: shifted: out-of-bounds load of x[64]")
    assert "oob.py:6" in err[-1] and len(err) <= 6, "\n".join(err)
    assert any('shifted[2, 32](x, out, 64, device="sim")' in line for line in err)


def test_strata_debug_shows_the_simulator_frames(tmp_path):
    err = _run(tmp_path, STRATA_DEBUG="1")
    assert len(err) > 10 and any("kernel_ir/sim.py" in line for line in err)
