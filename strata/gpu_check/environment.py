"""What the machine has, as the first lines of the report: Python, CPU, GPU and driver, torch
and its CUDA, cuda-bindings and NVRTC, the CUDA headers NVRTC will use, nvcc, ncu and
compute-sanitizer. Each probe answers in one line and never raises: a missing tool is a fact."""
from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess

from ..runtime.nvrtc import include_dirs, nvrtc_version


def _first_line(cmd: list[str], pick=lambda lines: lines[0]) -> str:
    exe = shutil.which(cmd[0])
    if exe is None:
        return "not found"
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{exe}: {type(e).__name__}"
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    return f"{pick(lines)} ({exe})" if lines else f"{exe}: no output"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _torch() -> tuple[str, str]:
    import torch
    text = f"{torch.__version__} (CUDA {torch.version.cuda})"
    if not torch.cuda.is_available():
        return text, "none visible to torch"
    p = torch.cuda.get_device_properties(0)
    return text, (f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                  f"{p.total_memory / 2**30:.0f} GiB")


def _nvrtc() -> str:
    try:
        major, minor = nvrtc_version()
        return f"{major}.{minor}; headers: {', '.join(include_dirs()) or 'none found'}"
    except Exception as e:      # a probe: whatever broke is the fact to report
        return f"unavailable ({type(e).__name__}: {e})"


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def facts() -> dict[str, str]:
    torch_text, gpu = _torch()
    return {
        "python": f"{platform.python_version()} ({platform.machine()})",
        "cpu": _cpu(),
        "gpu (torch)": gpu,
        "gpu (nvidia-smi)": _first_line(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                         "--format=csv,noheader"]),
        "torch": torch_text,
        "cuda-bindings": _version("cuda-bindings"),
        "nvrtc": _nvrtc(),
        "nvcc": _first_line(["nvcc", "--version"], lambda lines: lines[-1]),
        "ncu": _first_line(["ncu", "--version"], lambda lines: lines[-1]),
        "compute-sanitizer": _first_line(["compute-sanitizer", "--version"], lambda lines: lines[-1]),
        "strata": _version("strata"),
    }
