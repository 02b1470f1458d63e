"""What strata compiles for, as a value: the one place a GPU's or a CPU's numbers live.

A `Target` names the machine (`--target NAME`), its kind (gpu or cpu), the ISA the emitter writes
for, and the facts a schedule needs: warp size, SM or core count, shared memory, registers, the
widest vector access, which instructions exist, cache sizes. Passes ask it (`ctx.arch.has("wgmma")`,
`ctx.arch.fill_blocks`) instead of parsing names or hard-coding an H100. The GPU numbers are for
the reference part of each architecture (A100 for sm_80, H100 SXM for sm_90); what a
schedule tunes to them is a default, and knobs pin the rest.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import StrataError

KiB, MiB = 1 << 10, 1 << 20
STATIC_SMEM_BYTES = 48 * KiB        # CUDA: static __shared__ per block, on every architecture
DYNAMIC_SMEM_ALIGN = 1024           # dynamic shared memory base alignment the 128B swizzle needs
SOURCE = {"gpu": "cuda", "cpu": "c"}     # each kind's default Target.language


@dataclass(frozen=True)
class Target:
    name: str                            # what --target takes: "sm_90a", "cpu-avx2"
    kind: str                            # "gpu" | "cpu"
    isa: str                             # what the emitter targets: "sm_90a", "x86-64-v3"
    sm: int = 0                          # compute capability x 10 (90); 0 on a CPU
    warp_size: int = 1                   # threads that run in lock-step (1: a CPU core's loop)
    cores: int = 1                       # SMs of a GPU, cores of a CPU
    smem_per_block: int = 0              # static shared memory per block
    smem_optin: int = 0                  # dynamic shared memory a block may opt into
    registers: int = 0                   # 32-bit registers per thread at most
    vector_bytes: int = 16               # the widest vector load or store
    features: frozenset = field(default_factory=frozenset)
    caches: tuple = ()                   # (level, bytes), nearest first
    # a GPU's SM, for occupancy: resident threads, blocks and shared memory at most per SM
    sm_threads: int = 0
    sm_blocks: int = 0
    sm_smem: int = 0
    # the roofline of the reference part (0: not given): DRAM GB/s, CUDA-core ops and tensor-core
    # bf16 flops (dense) per second in tera
    dram_gbs: float = 0.0
    core_tops: float = 0.0
    tensor_tflops: float = 0.0
    machine: str = ""                    # a CPU's instruction set family: "x86_64", "aarch64"
    language: str = ""                   # the source its programs are printed in (codegen's
                                         # registry): CUDA C for a GPU, C for a CPU unless given

    def __post_init__(self):
        if not self.language:
            object.__setattr__(self, "language", SOURCE.get(self.kind, ""))

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def vector_registers(self) -> int:
        """A CPU's SIMD registers, which a register tile's accumulators must fit in: 32 with
        AVX-512 and on AArch64, 16 otherwise."""
        return 32 if self.has("avx512f") or self.machine == "aarch64" else 16

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def fill_blocks(self) -> int:
        """Blocks that keep every SM busy for two waves: below this a split pays."""
        return 2 * self.cores

    def occupancy(self, threads: int, registers: int, smem: int) -> tuple[int, str]:
        """Blocks of `threads` threads, `registers` per thread and `smem` bytes that one SM holds
        at once, and what limits them (registers are allocated per warp in 256s; from sm_80 on
        the driver reserves 1 KiB of shared memory per block)."""
        warps = -(-threads // self.warp_size)
        per_warp = -(-max(registers, 1) * self.warp_size // 256) * 256
        reserved = KiB if self.sm >= 80 else 0
        limits = {"threads": self.sm_threads // (warps * self.warp_size), "blocks": self.sm_blocks,
                  "registers": 65536 // per_warp // warps,
                  "shared memory": self.sm_smem // (smem + reserved) if smem else self.sm_blocks}
        why = min(limits, key=limits.get)
        return limits[why], why

    @property
    def key(self) -> str:
        """What a measurement on this target depends on (the tuning database's target column)."""
        return f"{self.name}:{self.isa}:{self.cores}:{'+'.join(sorted(self.features))}"

    def __str__(self) -> str:
        return self.name


def _gpu(name, sm, sms, optin_kib, l2_mib, sm_limits, features=(), roofline=(0.0, 0.0, 0.0)):
    tensor = ("mma.sync", "ldmatrix", "cp.async") if sm >= 80 else ()
    threads, blocks, smem_kib = sm_limits
    return Target(name, "gpu", name, sm=sm, warp_size=32, cores=sms,
                  smem_per_block=STATIC_SMEM_BYTES, smem_optin=optin_kib * KiB, registers=255,
                  vector_bytes=16, features=frozenset(tensor + tuple(features)),
                  caches=(("L1", 128 * KiB), ("L2", l2_mib * MiB)), sm_threads=threads,
                  sm_blocks=blocks, sm_smem=smem_kib * KiB, dram_gbs=roofline[0],
                  core_tops=roofline[1], tensor_tflops=roofline[2])


# H100's 132 SMs are every GPU's today (the splits of chunk_reduce and split_matmul_k aim at two
# waves of them); per-part counts come with measurements on those parts.
_SMS = 132
# H100 SXM's roofline: 3.35 TB/s HBM3, 132 SMs x 128 lanes x 1.83 GHz, 989 dense bf16 TFLOPS.
_H100 = (3350.0, 30.9, 989.0)
GPUS = [
    _gpu("sm_70", 70, _SMS, 96, 6, (2048, 32, 96)),
    _gpu("sm_75", 75, _SMS, 64, 4, (1024, 16, 64)),
    _gpu("sm_80", 80, _SMS, 163, 40, (2048, 32, 164)),
    _gpu("sm_86", 86, _SMS, 99, 6, (1536, 16, 100)),
    _gpu("sm_87", 87, _SMS, 163, 4, (1536, 16, 164)),
    _gpu("sm_89", 89, _SMS, 99, 72, (1536, 24, 100)),
    _gpu("sm_90", 90, _SMS, 227, 50, (2048, 32, 228), ("tma", "mbarrier"), _H100),
    _gpu("sm_90a", 90, _SMS, 227, 50, (2048, 32, 228), ("tma", "mbarrier", "wgmma"), _H100),
]
_AVX512 = {"sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
           "avx512_vnni"}


def _cpu(name, isa, vector_bytes, features, l1_kib, l2_kib, machine="x86_64"):
    return Target(name, "cpu", isa, cores=os.cpu_count() or 1, vector_bytes=vector_bytes,
                  features=frozenset(features), caches=(("L1", l1_kib * KiB), ("L2", l2_kib * KiB)),
                  machine=machine)


# The named CPUs: isa is gcc's -march (-mcpu on aarch64), so `--ir asm` shows any of them here.
CPUS = [
    _cpu("cpu", "x86-64", 16, {"sse2"}, 32, 512),
    _cpu("cpu-avx2", "x86-64-v3", 32, {"sse2", "avx", "avx2", "fma", "f16c"}, 32, 512),
    _cpu("cpu-znver4", "znver3", 64, _AVX512, 32, 1024),    # AMD Zen 4 (EPYC 9004): gcc 12 has
                                                            # no znver4: Zen 3 with its AVX-512
    _cpu("cpu-spr", "sapphirerapids", 64,                          # Sapphire / Emerald Rapids
         _AVX512 | {"avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}, 48, 2048),
    _cpu("cpu-neoverse", "neoverse-v1", 16, {"asimd", "neon", "sve"}, 64, 1024, "aarch64"),
    _cpu("cpu-rvv", "rv64gcv", 16, {"rvv"}, 32, 512, "riscv64"),    # RISC-V with the V extension
]
TARGETS = {t.name: t for t in GPUS + CPUS}
DEFAULT = TARGETS["sm_90"]          # what `strata compile` emits for when nothing says otherwise
# the stages a program prints (pipeline.py), the last ones the source each kind of target gets
STAGES = ("torch", "tensor", "loop", "tile", "kernel", "cuda", "c", "asm")
NAMES = tuple(TARGETS) + ("host",)


def sysfs_caches() -> dict[str, int]:
    """One core's caches from /sys/devices/system/cpu/cpu0/cache (L1d, L2, L3) in bytes."""
    out: dict[str, int] = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind = (d / "level").read_text().strip(), (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        out[f"L{level}{'d' if level == '1' else ''}"] = int(size.rstrip("KMG")) * scale
    return out


def host(cpuinfo: str | None = None) -> Target:
    """This machine's CPU: its cores, the vector and AMX features /proc/cpuinfo lists and its
    L1d and L2 sizes from sysfs (or the text `cpuinfo`, caches as the generic "cpu" target's:
    tests read the samples of each CPU class)."""
    caches = TARGETS["cpu"].caches
    if cpuinfo is None:
        found = sysfs_caches()
        if "L1d" in found and "L2" in found:
            caches = (("L1", found["L1d"]), ("L2", found["L2"]))
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    lines = cpuinfo.splitlines()
    flags = next((set(ln.split(":", 1)[1].split()) for ln in lines
                  if ln.startswith(("flags", "Features"))), set())
    known = {"sse2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
             "avx512_vnni", "avx_vnni", "f16c", "asimd", "sve", "amx_tile", "amx_bf16", "amx_int8"}
    features = frozenset(flags & known) | ({"neon"} if "asimd" in flags else set())
    isa = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("isa")), "")
    if isa.startswith("rv64") and "v" in isa[4:].split("_")[0]:
        features |= {"rvv"}                   # RISC-V's `isa : rv64imafdcv_...` line
    machine = "aarch64" if "asimd" in flags else "riscv64" if isa.startswith("rv64") else \
        "x86_64" if flags else platform.machine()
    width = 64 if "avx512f" in features else 32 if "avx2" in features else 16
    return replace(TARGETS["cpu"], name="host", isa="native", vector_bytes=width, features=features,
                   machine=machine, caches=caches)


def get_target(name: str | Target) -> Target:
    """The Target called `name`; an unknown name is one sentence listing the known ones."""
    if isinstance(name, Target):
        return name
    if name == "host":
        return host()
    if name not in TARGETS:
        raise StrataError(f"unknown target {name!r}; choose one of {', '.join(NAMES)}")
    return TARGETS[name]


def gpu_target(sm: str) -> str:
    """The target to compile for on a device of compute capability `sm` ("sm_90"): Hopper gets
    sm_90a, whose wgmma and TMA the tile passes use; every other GPU its own architecture."""
    name = "sm_90a" if sm == "sm_90" else sm
    if name not in TARGETS:
        raise StrataError(f"this GPU is {sm}, which strata has no target for; pin one of "
                          f"{', '.join(t.name for t in GPUS)} with --target")
    return name
