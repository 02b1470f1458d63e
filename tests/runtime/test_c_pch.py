"""The test run's precompiled C prelude (tests/c_pch.py) changes no program: a library built
through it is byte for byte the one the plain compile builds, for scalar and vector code."""
import pytest
import torch

import c_pch
import strata
from conftest import HAS_CC
from strata.runtime import cc

pytestmark = pytest.mark.skipif(not HAS_CC, reason="no C compiler: the CPU target cannot be built "
                                                   "here (install gcc)")


@pytest.mark.parametrize("fn, inputs", [
    (torch.tanh, (torch.randn(1009),)),
    (lambda a, b: a @ b, (torch.randn(37, 200, dtype=torch.bfloat16),
                          torch.randn(200, 45, dtype=torch.bfloat16))),
], ids=["tanh", "bf16-matmul"])
def test_a_library_built_on_the_precompiled_prelude_is_the_plain_ones(fn, inputs):
    cmd = cc.find_compiler()
    if not c_pch._is_gcc(tuple(cmd)):
        pytest.skip("the C compiler is not gcc: the tests compile without a precompiled prelude")
    source = strata.compile(fn, inputs, device="cpu").source("c")
    assert c_pch._prelude(source) is not None          # the prelude is found: the header is used
    assert cc.compile_shared(source, cmd) == cc.compile_shared.plain(source, cmd)
