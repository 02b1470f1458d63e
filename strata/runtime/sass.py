"""The machine code (SASS) of each kernel of a CUDA source for a GPU architecture, no GPU needed.

Why: whether a GEMV reads its weights with 16-byte loads (LDG.E.128, cp.async's LDGSTS.128, TMA's
UTMALDG) is decided by ptxas, not written in the CUDA C; a test that reads the SASS checks it on
any machine. The cubin comes from NVRTC (runtime/nvrtc.py), the text from `cuobjdump -sass`,
which runs `nvdisasm`: both from NVIDIA's pip wheels (or a CUDA toolkit on PATH).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter

from ..core.errors import CompileError, DeviceUnavailable
from .nvrtc import compile_cuda

INSTALL = "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
# a global load's opcode: LDG (to registers), LDGSTS (cp.async), UTMALDG (TMA), with its modifiers
_LOAD = re.compile(r"\b(LDGSTS|LDG|UTMALDG)((?:\.\w+)*)\s")     # (not LDGDEPBAR, a fence)
_BITS = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "64": 64, "128": 128, "256": 256}


def tool(name: str) -> str:
    """The path of an NVIDIA binary utility: from its pip wheel (cuda.pathfinder), else PATH."""
    try:
        from cuda import pathfinder
        found = pathfinder.find_nvidia_binary_utility(name)
    except (ImportError, AttributeError):
        found = None
    found = found or shutil.which(name)
    if found is None:
        raise DeviceUnavailable(f"reading SASS needs NVIDIA's {name}, which is not installed "
                                f"({INSTALL})")
    return found


def disassemble(cubin: bytes) -> dict[str, str]:
    """`cuobjdump -sass` of a cubin, split into each kernel's text by name."""
    cuobjdump, nvdisasm = tool("cuobjdump"), tool("nvdisasm")
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(nvdisasm), os.environ["PATH"]]))
    with tempfile.TemporaryDirectory(prefix="strata-sass-") as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, env=env,
                             timeout=120)
    if res.returncode != 0:
        raise CompileError(f"cuobjdump could not disassemble the cubin: {res.stderr.strip()}")
    parts = re.split(r"^\s*Function : (\w+)\s*$", res.stdout, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def sass(source: str, arch: str = "sm_90a") -> dict[str, str]:
    """The SASS of each kernel of `source` compiled by NVRTC for `arch`, by kernel name."""
    return disassemble(compile_cuda(source, arch))


def global_loads(text: str) -> Counter:
    """How many global loads of each width one kernel's SASS has: bits (8 ... 256), or "tma"."""
    out = Counter()
    for op, mods in _LOAD.findall(text):
        if op == "UTMALDG":
            out["tma"] += 1
            continue
        widths = [_BITS[m] for m in mods.split(".") if m in _BITS]
        out[widths[-1] if widths else 32] += 1
    return out


def prefetches_before_wait(text: str) -> bool:
    """Whether one kernel's SASS asks L2 for bytes (UBLKPF, cp.async.bulk.prefetch) before it
    waits for the kernel before it (ACQBULK, griddepcontrol.wait)."""
    return "UBLKPF" in text and "ACQBULK" in text and text.index("UBLKPF") < text.index("ACQBULK")
