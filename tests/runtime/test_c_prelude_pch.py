"""The precompiled C prelude (runtime/c_prelude_pch.py) changes no program: a library built through
it is byte for byte the one the plain compile builds (scalar and bf16 vector code); a compiler that is not gcc, the cache off, or a source without the prelude compiles the
source as it is."""
import pytest
import torch

import strata
from conftest import HAS_CC
from strata.runtime import c_prelude_pch, cc

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


def _gcc() -> list[str]:
    cmd = cc.find_compiler()
    if "Free Software Foundation" not in cc.compiler_identity(cmd)["version"]:
        pytest.skip("the C compiler is not gcc: programs compile without a precompiled prelude")
    return cmd


@pytest.mark.parametrize("fn, inputs", [
    (torch.tanh, (torch.randn(1009),)),
    (lambda a, b: a @ b, (torch.randn(37, 200, dtype=torch.bfloat16),
                          torch.randn(200, 45, dtype=torch.bfloat16))),
], ids=["tanh", "bf16-matmul"])
def test_a_library_built_on_the_precompiled_prelude_is_the_plain_ones(fn, inputs, cache_dir,
                                                                       monkeypatch):
    cmd = _gcc()
    source = strata.compile(fn, inputs, device="cpu").source("c")
    rewritten = c_prelude_pch.on_prelude_header(source, cmd, cc.FLAGS, cc.compiler_identity(cmd))
    assert rewritten != source and '#include "' in rewritten.split("\n")[2]
    assert list(cache_dir.glob("pch/*/prelude.h.gch"))          # built in the user cache
    with_header = cc.compile_shared(source, cmd)
    monkeypatch.setenv("STRATA_NO_CACHE", "1")                  # the cache off: compiled as it is
    assert c_prelude_pch.on_prelude_header(source, cmd, cc.FLAGS, cc.compiler_identity(cmd)) == source
    assert with_header == cc.compile_shared(source, cmd)


def test_what_has_no_prelude_or_no_gcc_compiles_as_it_is(cache_dir):
    cmd = cc.find_compiler()
    source = strata.compile(torch.tanh, (torch.randn(5),), device="cpu").source("c")
    clang = {"path": "/usr/bin/clang", "args": [], "version": "Debian clang version 16.0.6"}
    assert c_prelude_pch.on_prelude_header(source, cmd, cc.FLAGS, clang) == source
    assert c_prelude_pch.on_prelude_header("int x;\n" + source, cmd, cc.FLAGS,
                                           cc.compiler_identity(cmd)) == "int x;\n" + source
