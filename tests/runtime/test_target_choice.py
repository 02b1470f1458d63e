"""A program compiled to run on a GPU is compiled for that GPU (sm_90a on Hopper, so the wgmma
path is taken); a pinned --target wins; compiling without a GPU keeps the default."""
import pytest
import torch

from strata.api import on_device
from strata.core.context import Context
from strata.core.targets import DEFAULT
from strata.runtime import driver


@pytest.fixture
def gpu(monkeypatch):
    def pretend(sm):
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(driver, "arch", lambda device: sm)
    return pretend


@pytest.mark.parametrize("sm, want", [("sm_90", "sm_90a"), ("sm_80", "sm_80"), ("sm_89", "sm_89")])
def test_running_on_a_gpu_compiles_for_it(gpu, sm, want):
    gpu(sm)
    assert on_device(Context(), "cuda").arch.name == want


def test_a_pinned_target_wins(gpu):
    gpu("sm_90")
    assert on_device(Context(target="sm_80"), "cuda").arch.name == "sm_80"


def test_the_simulator_keeps_the_default(gpu):
    gpu("sm_80")
    assert on_device(Context(), "sim").arch == DEFAULT
    assert Context().target is None
