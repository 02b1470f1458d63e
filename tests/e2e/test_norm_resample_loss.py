"""Batch/group/instance norm, interpolate, losses, one_hot and repeat_interleave against eager:
simulator and native CPU."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import run_and_compare


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _bn(c, affine=True):
    m = nn.BatchNorm2d(c, affine=affine).eval()
    m.running_mean.normal_()
    m.running_var.uniform_(0.5, 2.0)
    if affine:
        m.weight.data.normal_()
        m.bias.data.normal_()
    return m


@pytest.mark.parametrize("make, shape", [
    pytest.param(lambda: _bn(3), (2, 3, 5, 4), id="batchnorm-eval"),
    pytest.param(lambda: _bn(3, affine=False), (1, 3, 1, 1), id="batchnorm-no-affine-1x1"),
    pytest.param(lambda: nn.BatchNorm1d(4).eval(), (3, 4, 7), id="batchnorm1d"),
    pytest.param(lambda: nn.GroupNorm(2, 6), (2, 6, 3, 5), id="groupnorm"),
    pytest.param(lambda: nn.GroupNorm(1, 4, affine=False), (1, 4, 7), id="groupnorm-one-group"),
    pytest.param(lambda: nn.InstanceNorm2d(3), (2, 3, 5, 6), id="instancenorm"),
    pytest.param(lambda: nn.InstanceNorm1d(3, affine=True), (2, 3, 9), id="instancenorm1d-affine"),
])
def test_norms(make, shape):
    torch.manual_seed(0)
    run_and_compare(make(), (r(*shape),))


@pytest.mark.parametrize("kw, shape", [
    (dict(scale_factor=2), (1, 2, 5, 6)),
    (dict(size=(7, 9)), (1, 2, 5, 6)),
    (dict(scale_factor=0.5), (1, 2, 5, 6)),
    (dict(size=(7, 9), mode="nearest-exact"), (1, 2, 5, 6)),
    (dict(size=(7, 9), mode="bilinear", align_corners=False), (1, 2, 5, 6)),
    (dict(size=(3, 13), mode="bilinear", align_corners=True), (2, 1, 5, 6)),
    (dict(scale_factor=1.7, mode="bilinear"), (1, 2, 5, 6)),
    (dict(size=11, mode="linear", align_corners=True), (1, 3, 4)),
    (dict(scale_factor=3, mode="nearest"), (1, 3, 4)),
    (dict(scale_factor=2, mode="trilinear"), (1, 2, 3, 4, 5)),
])
def test_interpolate(kw, shape):
    torch.manual_seed(0)
    run_and_compare(lambda x: F.interpolate(x, **kw), (r(*shape),))


def test_interpolate_bf16():
    torch.manual_seed(0)
    run_and_compare(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
                    (r(1, 2, 5, 6, dtype=torch.bfloat16),))


@pytest.mark.parametrize("fn, args", [
    pytest.param(lambda x, t: F.cross_entropy(x, t), (r(4, 10), torch.tensor([1, 2, 3, 9])),
                 id="cross-entropy"),
    pytest.param(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, reduction="sum"),
                 (r(5, 7), torch.tensor([1, -100, 3, 0, 6])), id="ignore-index-smoothing"),
    pytest.param(lambda x, t, w: F.cross_entropy(x, t, weight=w),
                 (r(2, 5, 3, 3), torch.randint(0, 5, (2, 3, 3)), torch.rand(5)), id="2d-weighted"),
    pytest.param(lambda x, t: F.cross_entropy(x, t, reduction="none"),
                 (r(6, 3), torch.tensor([0, 1, 2, 2, 1, 0])), id="none"),
    pytest.param(lambda x, t: F.nll_loss(x.log_softmax(-1), t), (r(10), torch.tensor(3)),
                 id="nll-unbatched"),
])
def test_losses(fn, args):
    run_and_compare(fn, args)


def test_one_hot_and_repeat_interleave():
    run_and_compare(lambda t: F.one_hot(t, 6), (torch.tensor([[1, 0], [5, 3]]),))
    run_and_compare(lambda x: torch.repeat_interleave(x, 3, dim=1), (r(2, 5, 4),))
    run_and_compare(lambda x: x.repeat_interleave(2), (r(3, 2),))
