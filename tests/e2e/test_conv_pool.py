"""Convolutions (implicit GEMM), pooling and padding against eager: simulator and native CPU."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import run_and_compare


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


CONVS = [
    # (input shape, conv kwargs: out channels, kernel, stride, padding, dilation, groups, bias)
    pytest.param((2, 3, 9, 11), dict(out=5, k=3, stride=1, padding=1), id="2d-same"),
    pytest.param((1, 4, 13, 7), dict(out=6, k=(3, 2), stride=(2, 1), padding=(0, 1), bias=False),
                 id="2d-stride-rect"),
    pytest.param((1, 4, 11, 11), dict(out=4, k=3, dilation=2, padding=2), id="2d-dilated"),
    pytest.param((2, 6, 7, 7), dict(out=6, k=3, padding=1, groups=6), id="2d-depthwise"),
    pytest.param((1, 4, 6, 5), dict(out=6, k=1, groups=2), id="2d-grouped-1x1"),
    pytest.param((1, 3, 32, 32), dict(out=8, k=16, stride=16), id="vit-patch"),
    pytest.param((2, 5, 17), dict(out=7, k=3, stride=2, padding=1), id="1d-whisper"),
    pytest.param((1, 2, 5, 4, 6), dict(out=3, k=2, padding=(1, 0, 1)), id="3d"),
    pytest.param((1, 1, 1, 1), dict(out=2, k=1), id="1x1-pixel"),
]


@pytest.mark.parametrize("shape, kw", CONVS)
def test_conv(shape, kw):
    torch.manual_seed(0)
    cls = {3: nn.Conv1d, 4: nn.Conv2d, 5: nn.Conv3d}[len(shape)]
    conv = cls(shape[1], kw["out"], kw["k"], stride=kw.get("stride", 1),
               padding=kw.get("padding", 0), dilation=kw.get("dilation", 1),
               groups=kw.get("groups", 1), bias=kw.get("bias", True)).eval()
    run_and_compare(conv, (r(*shape),), contraction=True)


def test_conv_relu_epilogue_and_bf16():
    torch.manual_seed(0)
    bf = torch.bfloat16
    run_and_compare(lambda x, w, bias: torch.relu(F.conv2d(x, w, bias, padding=1)),
                    (r(1, 8, 10, 10, dtype=bf), r(16, 8, 3, 3, dtype=bf) * 0.2, r(16, dtype=bf)),
                    contraction=True)


def test_conv_padding_modes():
    torch.manual_seed(0)
    for mode in ("reflect", "replicate", "circular"):
        conv = nn.Conv2d(2, 3, 3, padding=1, padding_mode=mode).eval()
        run_and_compare(conv, (r(1, 2, 6, 5),), contraction=True)


TRANSPOSED = [
    # (input shape, ConvTranspose kwargs)
    pytest.param((1, 2, 4, 4), dict(out=2, k=3), id="2d"),
    pytest.param((2, 4, 5, 3), dict(out=6, k=(3, 2), stride=(2, 3), padding=(1, 0),
                                    output_padding=(1, 2)), id="2d-stride-pad-outpad"),
    pytest.param((1, 4, 5, 5), dict(out=6, k=3, stride=2, groups=2, dilation=2), id="2d-grouped-dilated"),
    pytest.param((2, 3, 7), dict(out=5, k=4, stride=2, padding=1, bias=False), id="1d-upsample"),
    pytest.param((1, 2, 3, 2, 3), dict(out=3, k=2, stride=2), id="3d"),
    pytest.param((1, 1, 1, 1), dict(out=1, k=1), id="1x1-pixel"),
]


@pytest.mark.parametrize("shape, kw", TRANSPOSED)
def test_conv_transpose(shape, kw):
    torch.manual_seed(0)
    cls = {3: nn.ConvTranspose1d, 4: nn.ConvTranspose2d, 5: nn.ConvTranspose3d}[len(shape)]
    conv = cls(shape[1], kw["out"], kw["k"], stride=kw.get("stride", 1),
               padding=kw.get("padding", 0), output_padding=kw.get("output_padding", 0),
               groups=kw.get("groups", 1), bias=kw.get("bias", True),
               dilation=kw.get("dilation", 1)).eval()
    run_and_compare(conv, (r(*shape),), contraction=True)


@pytest.mark.parametrize("fn", [
    pytest.param(lambda x: F.max_pool2d(x, 2), id="max2d"),
    pytest.param(lambda x: F.max_pool2d(x, 3, stride=2, padding=1), id="max2d-pad"),
    pytest.param(lambda x: F.max_pool2d(x, 3, stride=2, ceil_mode=True), id="max2d-ceil"),
    pytest.param(lambda x: F.max_pool2d(x, 2, dilation=2), id="max2d-dilated"),
    pytest.param(lambda x: F.max_pool2d(x, 2, return_indices=True), id="max2d-indices"),
    pytest.param(lambda x: F.avg_pool2d(x, 2), id="avg2d"),
    pytest.param(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), id="avg2d-pad"),
    pytest.param(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
                 id="avg2d-pad-excluded"),
    pytest.param(lambda x: F.avg_pool2d(x, 3, stride=2, ceil_mode=True), id="avg2d-ceil"),
    pytest.param(lambda x: F.avg_pool2d(x, 2, divisor_override=3), id="avg2d-divisor"),
    pytest.param(lambda x: F.adaptive_avg_pool2d(x, 1), id="adaptive-avg-global"),
    pytest.param(lambda x: F.adaptive_avg_pool2d(x, (3, 4)), id="adaptive-avg-uneven"),
    pytest.param(lambda x: F.adaptive_max_pool2d(x, (2, 3)), id="adaptive-max"),
    pytest.param(lambda x: F.max_pool1d(x.flatten(2), 3, stride=2), id="max1d"),
    pytest.param(lambda x: F.avg_pool1d(x.flatten(2), 4), id="avg1d"),
    pytest.param(lambda x: F.adaptive_avg_pool1d(x.flatten(2), 5), id="adaptive-avg1d"),
])
def test_pool(fn):
    torch.manual_seed(0)
    run_and_compare(fn, (r(2, 3, 9, 7),))


@pytest.mark.parametrize("mode, amounts", [
    ("constant", (1, 2)), ("constant", (1, 0, 2, 3)), ("constant", (-1, 2)),
    ("reflect", (2, 1, 0, 1)), ("reflect", (1, 1, 2, 0)), ("replicate", (3, 1, 1, 2)),
    ("circular", (2, 1, 1, 1)),
])
def test_pad(mode, amounts):
    torch.manual_seed(0)
    kw = {"value": 0.5} if mode == "constant" else {}
    run_and_compare(lambda x: F.pad(x, amounts, mode=mode, **kw), (r(1, 2, 5, 6),))


def test_small_cnn():
    """conv + batch norm (eval) + relu + pooling + linear head, as a torchvision-style CNN."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1, groups=2), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    run_and_compare(net, (r(2, 3, 12, 12),), contraction=True)
