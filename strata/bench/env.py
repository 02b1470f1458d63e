"""Where and when a benchmark ran: device, date and the versions that shape its numbers, recorded
with every report so results from different machines or commits are never confused."""
from __future__ import annotations

import ctypes.util
from importlib.metadata import PackageNotFoundError, version
import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from ..core.targets import get_target, gpu_target
from ..runtime.cc import find_compiler
from ..runtime.nvrtc import nvrtc_version
from ..tune.machine import facts
from .results import Env


def strata_version() -> str:
    try:
        v = version("strata")
    except PackageNotFoundError:
        v = "unknown"
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=here, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, cwd=here,
                               check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):       # no git, or not a checkout
        sha, dirty = "", ""
    return f"{v}+{sha}{'.dirty' if dirty else ''}" if sha else v


def _optional_versions() -> dict[str, str]:
    out = {}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "not installed"
    try:
        out["NVRTC"] = ".".join(map(str, nvrtc_version()))
    except Exception as e:  # noqa: BLE001 - a missing NVRTC is worth a note, not a failed report
        out["NVRTC"] = f"unavailable ({type(e).__name__})"
    return out


def collect_env() -> Env:
    """The environment of a CUDA run (needs a GPU)."""
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    extra = _optional_versions()
    extra["compute capability"] = f"{props.major}.{props.minor}"
    l2 = getattr(props, "L2_cache_size", None)
    if l2:
        extra["L2"] = f"{l2 / 2**20:.0f} MiB"
    return Env(device=torch.cuda.get_device_name(idx),
               date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               torch=torch.__version__, cuda=torch.version.cuda, strata=strata_version(),
               python=platform.python_version(), extra=extra)


def cpu_name() -> str:
    """The CPU's model name, its part where family and model tell it, and its core count, e.g.
    "AMD EPYC Zen 5 (Turin), 2 cores": two parts share the model name "AMD EPYC" here (Zen 4 and
    Zen 5 both with AVX-512), and a report must say which it measured."""
    p = facts()
    part = p.part.split(" (family")[0].split(" (CPU part")[0]
    model = p.model if p.model != "unknown" else (platform.processor() or "CPU")
    return f"{model}{'' if part == 'unknown part' else ' ' + part}, {os.cpu_count()} cores"


def collect_cpu_env(threads: int) -> Env:
    """The environment of a native CPU run: the CPU, the threads used, the C compiler and the
    target strata compiled for (its ISA and vector width)."""
    host = get_target("host")
    try:
        cc = find_compiler()
        cc_version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=10,
                                    check=False).stdout.splitlines()[0]
    except Exception as e:  # noqa: BLE001 - no compiler is worth a note, the run says why later
        cc_version = f"unavailable ({type(e).__name__})"
    extra = {"threads": str(threads), "C compiler": cc_version,
             "target": f"host ({host.vector_bytes * 8}-bit vectors: {', '.join(sorted(host.features))})",
             "allocator": allocator()}
    return Env(device=cpu_name(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               torch=torch.__version__, cuda=None, strata=strata_version(),
               python=platform.python_version(), extra=extra)


def allocator() -> str:
    """The process's malloc: a preloaded tcmalloc or jemalloc (PyTorch's CPU tuning advice) keeps
    freed memory, so eager's and Inductor's fresh tensors fault no new pages; glibc's does not."""
    preload = _preloaded()
    return f"{', '.join(preload)} (LD_PRELOAD)" if preload else "glibc malloc (nothing preloaded)"


def _preloaded() -> list[str]:
    return [Path(p).name for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
            if "malloc" in Path(p).name]


TCMALLOC = "libtcmalloc_minimal.so.4"


def rerun_with_tcmalloc(module: str, argv: list[str]) -> None:
    """Run `python -m module argv` again with tcmalloc preloaded, unless a malloc is preloaded
    already: the baselines' best allocator, so a benchmark compares with their best. Where it is
    not installed, say so in one sentence on stderr and go on (glibc's malloc, named in the
    report)."""
    if _preloaded():
        return
    lib = next((str(d / TCMALLOC) for d in map(Path, ("/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                                                       "/usr/lib/aarch64-linux-gnu", "/usr/lib"))
                if (d / TCMALLOC).exists()), None) or ctypes.util.find_library("tcmalloc_minimal")
    if lib is None:
        print("strata: tcmalloc is not installed, so eager and Inductor run on glibc's malloc, "
              "which faults fresh pages (apt-get install libtcmalloc-minimal4 for their best)",
              file=sys.stderr)
        return
    env = dict(os.environ, LD_PRELOAD=lib)
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


def cpu_class() -> str:
    """The host's vector class for report names: two CPU classes can share a model name (the
    AVX-512 and the AVX2-only "AMD EPYC" here), and one must not overwrite the other's report."""
    f = get_target("host").features
    classes = (("amx", "amx_bf16"), ("avx512", "avx512f"), ("avx2", "avx2"), ("neon", "neon"))
    return next((name for name, flag in classes if flag in f), platform.machine() or "cpu")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def strata_target(capability: tuple[int, int] | None = None) -> str:
    """The architecture strata compiles for on this device (targets.gpu_target: sm_90a on compute
    capability 9.0, else sm_XY). capability: (major, minor), default the GPU's."""
    if capability is None:
        capability = torch.cuda.get_device_capability(torch.cuda.current_device())
    major, minor = capability
    return gpu_target(f"sm_{major}{minor}")
