"""A KernelProgram built for another instruction set (cpu-neoverse on x86) and run under qemu-user.

Why: `--ir asm` shows an ARM server's code, but only running it shows that it computes the right
thing. The program's C and a small `main` are built by Debian's cross gcc into one executable,
which qemu-user (`qemu-aarch64 -L /usr/aarch64-linux-gnu`) runs: the inputs and weights go in as
files, `strata_run` runs every kernel (packing ones too), and the outputs and the inputs a kernel
updates in place come back as files. Outputs and temps start as all-ones bytes (NaN), so an
element no kernel writes shows. Emulated: right, not fast (no timing is taken here).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from ..core import dtypes
from ..core.errors import CompileError, DeviceUnavailable
from ..kernel_ir.ir import KernelProgram
from .args import prepare_args, prepare_weights
from .disasm import build
from .program import mutated_inputs

MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
void strata_run(void** args);
/* argv[1]: buffers; then per buffer: bytes, r (read), w (write), b (both) or t (temp), file */
int main(int argc, char** argv) {
    int n = argc > 1 ? atoi(argv[1]) : 0;
    if (argc != 2 + 3 * n) { fprintf(stderr, "strata harness: bad arguments\n"); return 2; }
    void** args = calloc(n ? n : 1, sizeof(void*));
    for (int i = 0; i < n; i++) {
        size_t bytes = strtoull(argv[2 + 3 * i], 0, 10);
        char mode = argv[3 + 3 * i][0];
        args[i] = aligned_alloc(64, (bytes + 127) / 64 * 64);
        memset(args[i], 0xff, bytes);
        if (mode == 'r' || mode == 'b') {
            FILE* f = fopen(argv[4 + 3 * i], "rb");
            if (!f || fread(args[i], 1, bytes, f) != bytes) { fprintf(stderr, "cannot read %s\n", argv[4 + 3 * i]); return 2; }
            fclose(f);
        }
    }
    strata_run(args);
    for (int i = 0; i < n; i++) {
        char mode = argv[3 + 3 * i][0];
        if (mode == 'w' || mode == 'b') {
            FILE* f = fopen(argv[4 + 3 * i], "wb");
            size_t bytes = strtoull(argv[2 + 3 * i], 0, 10);
            if (!f || fwrite(args[i], 1, bytes, f) != bytes) { fprintf(stderr, "cannot write %s\n", argv[4 + 3 * i]); return 2; }
            fclose(f);
        }
    }
    return 0;
}
"""


# qemu's CPU where its default lacks the target's vectors (RISC-V's V extension, version 1.0)
_QEMU_CPU = {"riscv64": ("-cpu", "rv64,v=true,vlen=256,elen=64,vext_spec=v1.0")}


def qemu_for(machine: str) -> str:
    """The qemu-user binary for `machine`; DeviceUnavailable (one sentence) where there is none."""
    path = shutil.which(f"qemu-{machine}")
    if path is None:
        raise DeviceUnavailable(f"running {machine} code here needs qemu-{machine}, which is not "
                                f"installed (apt-get install qemu-user)")
    return path


class QemuProgram:
    """Run a KernelProgram under qemu-user (see the module docstring): run(inputs) -> outputs."""

    def __init__(self, program: KernelProgram, weights: Mapping[str, torch.Tensor] | None, *,
                 inputs: Mapping | None, target, source: str):
        self.program, self.target = program, target
        self.qemu = qemu_for(target.machine)
        self.spec = dict(inputs) if inputs is not None else {
            b.name: b for b in program.buffers if b.kind == "input"}
        self.mutated = set(mutated_inputs(program))
        self.weights = prepare_weights(program.buffers, weights or {}, "cpu")
        self.dir = tempfile.TemporaryDirectory(prefix="strata-qemu-")
        exe = Path(self.dir.name, "program")
        exe.write_bytes(build(target, {"strata.c": source, "main.c": MAIN}, "program", libs=("-lm",)))
        exe.chmod(0o755)
        for i, b in enumerate(program.buffers):        # weights never change: written once
            if b.name in self.weights:
                _raw(self.weights[b.name]).tofile(Path(self.dir.name, f"b{i}"))
        print(f"strata: {target} code runs under {Path(self.qemu).name} (emulated: checked, not "
              f"timed)", file=sys.stderr)

    threads = 2           # OMP_NUM_THREADS under qemu (emulated threads: for the check, not speed)

    def run(self, inputs) -> list[torch.Tensor]:
        """The outputs, in program output order, as CPU tensors; updated inputs are written back."""
        given = list(inputs)
        args = dict(zip(self.spec, prepare_args(self.spec, given, "cpu")))
        d = Path(self.dir.name)
        argv = [str(len(self.program.buffers))]
        for i, b in enumerate(self.program.buffers):
            nbytes = b.numel * dtypes.ITEMSIZE[b.dtype]
            mode = "b" if b.name in self.mutated else "r" if b.name in args or b.name in self.weights \
                else "w" if b.kind == "output" else "t"
            if b.name in args:
                _raw(args[b.name]).tofile(d / f"b{i}")
            argv += [str(nbytes), mode, str(d / f"b{i}")]
        env = {"OMP_WAIT_POLICY": "passive", "OMP_NUM_THREADS": str(self.threads), "PATH": "/usr/bin"}
        res = subprocess.run([self.qemu, *_QEMU_CPU.get(self.target.machine, ()),
                              "-L", f"/usr/{self.target.machine}-linux-gnu", str(d / "program"),
                              *argv], capture_output=True, text=True, timeout=1800, env=env)
        if res.returncode != 0:
            raise CompileError(f"the {self.target} program failed under {Path(self.qemu).name} "
                               f"(exit {res.returncode}): {(res.stderr or res.stdout).strip()[-2000:]}")
        index = {b.name: i for i, b in enumerate(self.program.buffers)}
        for name, g in zip(self.spec, given):
            if name in self.mutated:
                g.copy_(_read(d / f"b{index[name]}", self.program.buffer(name)))
        return [_read(d / f"b{index[name]}", self.program.buffer(name)) for name in self.program.outputs]


def _raw(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor (16-bit floats as their bits)."""
    t = t.detach().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.reshape(-1).numpy().view(np.uint8)


def _read(path: Path, buf) -> torch.Tensor:
    raw = torch.from_numpy(np.fromfile(path, dtype=np.uint8))
    return raw.view(dtypes.to_torch(buf.dtype)).reshape(tuple(buf.shape)).clone()
