"""The AMX bf16 micro-kernel (strata/codegen/amx_kernel.c): its emulation on every machine with a C
compiler, the real tiles where the CPU has them, and the tile configuration it writes.

Tolerance: the kernel's result is fp32 from fp32 accumulation of exact bf16 products, so it is
compared with float64 matmul of the same bf16 values, not with a bf16 tolerance. Each output is a
chain of at most K/2 + 2K/32 fp32 roundings (K <= 96 here: 54), so its error is at most about
54 * 2**-24 = 3.2e-6 of sum_k |a_ik b_kj|; we allow 1e-5 of that sum, elementwise. And where
the CPU has AMX, emulation and instructions must agree bit for bit (they did on the Emerald
Rapids this was written on, subnormal and overflow cases included).
"""
import ctypes
import subprocess
import sys

import pytest
import torch

from strata.bench.amx_probe import KERNEL, gemm, has_amx, load_kernel, pack_vnni
from conftest import HAS_CC

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler to build the kernel with")
AMX_REASON = ("this CPU has no AMX (no amx_tile and amx_bf16 in /proc/cpuinfo), so only the "
              "emulation runs")
needs_amx = pytest.mark.skipif(not has_amx(), reason=AMX_REASON)
# M, N, K, extra row stride of A (lda - K), extra row stride of C (ldc - N)
SHAPES = [(16, 16, 32, 0, 0),        # one tile step
          (48, 80, 96, 40, 16),      # 2x2 blocks and 16-wide edges in M and N, 3 K steps, strides
          (32, 32, 64, 0, 0)]        # exactly one 2x2 block
# what the kernel configures: palette 1, tiles 0-7 of 16 rows x 64 bytes, the rest zero
EXPECTED_CFG = bytes([1] + [0] * 15 + [64, 0] * 8 + [0] * 16 + [16] * 8 + [0] * 8)


@pytest.fixture(scope="module")
def emu():
    return load_kernel(emulate=True)


# A tile configuration whose stores the compiler dropped faults (#GP, SIGSEGV) in ldtilecfg:
# the real one is first loaded and read back in a child process, so that shows as a failure.
ROUNDTRIP = """
import ctypes, sys
from strata.runtime import native_build
lib = native_build.load_library(native_build.build_library(open(sys.argv[1]).read()))
w, r = (ctypes.c_uint8 * 64)(), (ctypes.c_uint8 * 64)()
print(lib.strata_amx_config_roundtrip(w, r), bytes(w).hex(), bytes(r).hex())
"""


@pytest.fixture(scope="module")
def amx_roundtrip():
    if not has_amx():
        pytest.skip(AMX_REASON)
    run = subprocess.run([sys.executable, "-c", ROUNDTRIP, str(KERNEL)], capture_output=True,
                         text=True, timeout=300, check=False)
    if run.returncode != 0:
        pytest.fail(f"loading the tile configuration killed the process (rc {run.returncode}; "
                    f"stores dropped before ldtilecfg?):\n{run.stderr[-2000:]}")
    rc, written, read = run.stdout.split()
    if int(rc) != 0:
        pytest.skip(f"Linux refused this process AMX tile data (arch_prctl(ARCH_REQ_XCOMP_PERM) "
                    f"gave {rc}; it needs Linux 5.16 or later), so only the emulation runs")
    return int(rc), bytes.fromhex(written), bytes.fromhex(read)


@pytest.fixture(scope="module")
def amx(amx_roundtrip):
    _, written, read = amx_roundtrip
    assert read == written == EXPECTED_CFG, (written.hex(), read.hex())
    lib = load_kernel(emulate=False)
    rc = lib.strata_amx_request_permission()
    assert rc == 0, f"arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: {rc}"
    return lib


def _operands(m, n, k, lda_pad, seed=0):
    g = torch.Generator().manual_seed(seed)
    a_full = torch.randn(m, k + lda_pad, generator=g).to(torch.bfloat16)
    b = torch.randn(k, n, generator=g).to(torch.bfloat16)
    return a_full, b


def _run(lib, m, n, k, lda_pad, ldc_pad, threads=1):
    a_full, b = _operands(m, n, k, lda_pad)
    c_full = torch.full((m, n + ldc_pad), -7.0)          # the padding must stay untouched
    cfg = (ctypes.c_uint8 * 64)()
    gemm(lib, a_full, pack_vnni(b), threads, k=k, out=c_full, cfg_out=cfg)
    a = a_full[:, :k].double()
    ref, bound = a @ b.double(), a.abs() @ b.double().abs()
    c = c_full[:, :n].double()
    assert ((c - ref).abs() <= 1e-5 * bound).all(), f"max err {(c - ref).abs().max():.3g}"
    assert (c - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert (c_full[:, n:] == -7.0).all()
    assert bytes(cfg) == EXPECTED_CFG, "tile configuration read back in the kernel differs"
    return c_full


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])))
def test_emulation_matches_float64(emu, shape):
    assert emu.strata_amx_emulated() == 1
    _run(emu, *shape)


@needs_amx
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])))
def test_amx_matches_float64_and_emulation_bitwise(amx, emu, shape):
    assert amx.strata_amx_emulated() == 0
    real, emulated = _run(amx, *shape), _run(emu, *shape)
    assert torch.equal(real.view(torch.int32), emulated.view(torch.int32))


def test_amx_tile_config_reads_back_as_written_in_a_child(amx_roundtrip):
    _, written, read = amx_roundtrip
    assert written == EXPECTED_CFG
    assert read == written


@pytest.mark.parametrize("which", ["emu", "amx"])
def test_tile_config_reads_back_as_written(which, request):
    lib = request.getfixturevalue(which)
    written, read = (ctypes.c_uint8 * 64)(), (ctypes.c_uint8 * 64)()
    assert lib.strata_amx_config_roundtrip(written, read) == 0
    assert bytes(written) == EXPECTED_CFG
    assert bytes(read) == bytes(written)


def test_two_threads_split_n(emu, request):
    _run(emu, 48, 80, 96, 8, 0, threads=2)
    if has_amx():
        _run(request.getfixturevalue("amx"), 48, 80, 96, 8, 0, threads=2)


def test_bad_shapes_are_refused(emu):
    a, b = _operands(16, 16, 48, 0)                       # K not a multiple of 32
    with pytest.raises(RuntimeError, match="returned 1 "):
        gemm(emu, a, pack_vnni(torch.zeros(48, 16, dtype=torch.bfloat16)))


def _subnormal_case():
    """tdpbf16ps reads bf16 subnormals as zero and flushes subnormal fp32 results to zero."""
    a, b = torch.zeros(16, 32, dtype=torch.bfloat16), torch.zeros(32, 16, dtype=torch.bfloat16)
    a[0, 0], b[0, 0] = 2.0 ** -70, 2.0 ** -70             # product 2**-140: fp32 subnormal
    a[1, 0] = torch.tensor(0x0001, dtype=torch.int16).view(torch.bfloat16)   # bf16 subnormal
    a[2, 0], b[0, 1] = 1.0, 2.0 ** 100
    return a, b


@pytest.mark.parametrize("which", ["emu", "amx"])
def test_subnormals_flush_to_zero(which, request):
    lib = request.getfixturevalue(which)
    a, b = _subnormal_case()
    c = gemm(lib, a, pack_vnni(b))
    assert (a.double() @ b.double())[0, 0] != 0 and (a.double() @ b.double())[1, 1] != 0
    assert c[0, 0] == 0 and c[1, 1] == 0                  # IEEE would give 2**-140 and 2**-33
    assert c[2, 1] == 2.0 ** 100


@needs_amx
def test_amx_and_emulation_agree_on_wide_magnitudes(amx, emu):
    g = torch.Generator().manual_seed(1)
    scale = lambda *s: torch.exp2(torch.randint(-30, 30, s, generator=g).float())  # noqa: E731
    a = (torch.randn(32, 256, generator=g) * scale(32, 256)).to(torch.bfloat16)
    b = (torch.randn(256, 48, generator=g) * scale(256, 48)).to(torch.bfloat16)
    bp = pack_vnni(b)
    assert torch.equal(gemm(amx, a, bp).view(torch.int32), gemm(emu, a, bp).view(torch.int32))


def test_probe_exits_2_without_amx(monkeypatch, capsys):
    import strata.bench.amx_probe as probe
    monkeypatch.setattr(probe, "has_amx", lambda: False)
    assert probe.main() == 2
    assert "no AMX" in capsys.readouterr().out
