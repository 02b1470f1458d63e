"""runtime/mca.py: each kernel's innermost hot loop in `--ir asm`, and llvm-mca's cycles for it."""
import shutil

import pytest

from strata.api import compile_snippet
from strata.core.context import Context
from strata.runtime import mca
from strata.core.targets import get_target

X86 = """\
 100:	vxorps %xmm0,%xmm0,%xmm0
 104:	vmovaps (%rdx),%zmm1
 10a:	vbroadcastss (%rax),%zmm7
 110:	vfmadd231ps %zmm1,%zmm7,%zmm17
 116:	vfmadd231ps %zmm1,%zmm7,%zmm18
 11c:	add    $0x4,%rax
 120:	cmp    %rdx,%rcx
 123:	jne    104 <k_x._omp_fn.0+0x104>
 125:	add    $0x1,%r8
 129:	cmp    %r8,%r9
 12c:	jne    100 <k_x._omp_fn.0+0x100>
 12e:	lea    0x0(%rip),%rax        # 135 <k_x._omp_fn.0+0x135>
			131: R_X86_64_PC32	.rodata-0x4
"""
ARM = """\
 1e0:	ldr	q1, [x3, x2]
 1e4:	fmla	v0.4s, v1.4s, v2.4s
 1e8:	fmla	v3.4s, v1.4s, v4.4s
 1ec:	add	x2, x2, #0x10
 1f0:	cbnz	x4, 1e0 <k_y._omp_fn.0+0x1e0>	// b.any
"""
SVE = (" 1e0:	ld1w	{z1.s}, p0/z, [x3, x2, lsl #2]\n 1e4:	fmla	z0.s, p0/m, z1.s, z2.s\n"
       " 1e8:	b.ne	1e0 <k_z+0x1e0>\n")


def test_the_innermost_loop_is_chosen_and_cleaned():
    body = mca.hot_loop(X86)
    assert body[0].startswith("vmovaps") and body[-1].startswith("jne") and len(body) == 7
    arm = mca.hot_loop(ARM)
    assert arm[0] == "ldr	q1, [x3, x2]" and arm[-1].startswith("cbnz") and len(arm) == 5
    assert mca.hot_loop(" 10:	ret\n") == []


def test_without_llvm_mca_the_line_says_so(monkeypatch):
    monkeypatch.setattr(mca.shutil, "which", lambda name: None)
    line = mca.summary("k_x", mca.hot_loop(X86), get_target("cpu-spr"))
    assert line == ("// k_x: hot loop of 7 instructions, 2 vector FMAs: llvm-mca not installed "
                    "(apt-get install llvm)")


@pytest.mark.skipif(shutil.which("llvm-mca") is None, reason="llvm-mca is not installed "
                    "(apt-get install llvm)")
@pytest.mark.parametrize("target, body, cycles", [
    ("cpu-spr", X86, (3.5, 6.0)),          # each FMA waits for its own result of the last step
    ("cpu-neoverse", ARM, (1.0, 8.0))])
def test_llvm_mca_prices_a_loop(target, body, cycles):
    got, why = mca.cycles_per_iteration(mca.hot_loop(body), get_target(target))
    assert why == "" and cycles[0] <= got <= cycles[1], (got, why)


@pytest.mark.skipif(shutil.which("llvm-mca") is None, reason="llvm-mca is not installed "
                    "(apt-get install llvm)")
def test_what_llvm_mca_cannot_model_is_named_not_skipped():
    """llvm-mca skips an instruction it cannot parse and prices the rest: that is no price."""
    body = mca.hot_loop(SVE)
    assert body[0].startswith("ld1w")
    got, why = mca.cycles_per_iteration(["strata_no_such_op x1, x2", *body], get_target("cpu-neoverse"))
    assert got is None and why.startswith("llvm-mca cannot model it on neoverse-v1")
    assert "(strata_no_such_op)" in why


@pytest.mark.skipif(shutil.which("llvm-mca") is None, reason="llvm-mca is not installed "
                    "(apt-get install llvm)")
def test_asm_heads_each_kernel_with_its_hot_loop():
    program, _ = compile_snippet("torch.randn(96, 256) @ torch.randn(256, 128)",
                                 Context(target="cpu-spr"), until="asm")
    head = [ln for ln in program.ir("asm").splitlines()[:6] if ln.startswith("// k_matmul")]
    assert len(head) == 1 and "24 vector FMAs" in head[0] and "on sapphirerapids (llvm-mca)" in head[0]
    cycles = float(head[0].split(": ")[-1].split()[0])
    assert 12.0 <= cycles <= 30.0                   # a 6 x 4 tile: 24 FMAs on two ports, at least 12
