"""Call-time argument checks of the runtime, on CPU tensors: one sentence naming the argument for
a wrong count, type, shape, dtype or device; copies only for non-contiguous or misaligned ones."""
import pytest
import torch

from strata.core.errors import InputMismatch
from strata.frontend.torch_ir import TorchType
from strata.kernel_ir.ir import Buffer
from strata.runtime.args import (
    POINTER_ALIGN,
    as_kernel_arg,
    check_args,
    prepare_args,
    prepare_weights,
)

SPEC = {"x": TorchType((4, 8), "f32"), "y": TorchType((8,), "bf16")}


def _ok():
    return [torch.randn(4, 8), torch.randn(8).bfloat16()]


def _sentence(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_matching_arguments_pass_through_without_copies():
    args = _ok()
    out = prepare_args(SPEC, args, "cpu")
    assert all(o.data_ptr() == a.data_ptr() for o, a in zip(out, args))


@pytest.mark.parametrize("args,words", [
    (lambda: _ok()[:1], "expected 2 inputs (x, y), got 1"),
    (lambda: [torch.randn(4, 8), 3.0], "input 'y' must be a tensor, got float"),
    (lambda: [torch.randn(8, 4), torch.randn(8).bfloat16()],
     "input 'x' has shape (8, 4), but the program was compiled for (4, 8)"),
    (lambda: [torch.randn(4, 8), torch.randn(8)],
     "input 'y' is float32, but the program was compiled for bfloat16 (y.to(torch.bfloat16) "
     "converts it)"),
    (lambda: [torch.randn(4, 8).to(torch.complex64), torch.randn(8).bfloat16()],
     "input 'x' is complex64, but the program was compiled for float32"),
])
def test_mismatches_name_the_argument(args, words):
    with pytest.raises(InputMismatch) as e:
        prepare_args(SPEC, args(), "cpu")
    assert words in _sentence(e)


def test_a_dtype_mismatch_is_a_sentence_about_the_dtype():
    """Issue 51: an input named `input` given as float64 read "input input has shape (2, 8) f64"."""
    with pytest.raises(InputMismatch) as e:
        check_args({"input": TorchType((2, 8), "f32")}, [torch.randn(2, 8, dtype=torch.float64)])
    assert _sentence(e) == ("input 'input' is float64, but the program was compiled for float32 "
                            "(input.to(torch.float32) converts it)")


def test_a_tensor_on_another_device_is_rejected():
    """The CUDA runtime passes device="cuda:0"; CPU tensors must be refused, not copied."""
    with pytest.raises(InputMismatch) as e:
        prepare_args(SPEC, _ok(), torch.device("cuda", 0))
    msg = _sentence(e)
    assert "input 'x' is on cpu but the program runs on cuda:0" in msg and "x.to('cuda:0')" in msg


def test_device_index_is_checked_only_when_given():
    check_args(SPEC, _ok(), "cpu")
    check_args(SPEC, [t.to("meta") for t in _ok()], "meta")
    with pytest.raises(InputMismatch, match="input 'x' is on meta"):
        check_args(SPEC, [t.to("meta") for t in _ok()], "cpu")


def test_no_device_means_any_device():
    check_args(SPEC, [t.to("meta") for t in _ok()], None)


def test_non_contiguous_input_is_made_contiguous():
    x = torch.randn(8, 4).t()                     # (4, 8), strides (1, 4)
    assert not x.is_contiguous()
    out = prepare_args(SPEC, [x, torch.randn(8).bfloat16()], "cpu")[0]
    assert out.is_contiguous() and torch.equal(out, x)


def test_misaligned_contiguous_view_is_copied_to_an_aligned_buffer():
    base = torch.randn(33)
    x = base[1:]                                  # contiguous, data pointer 4 bytes off
    assert x.is_contiguous() and x.data_ptr() % POINTER_ALIGN
    out = as_kernel_arg(x)
    assert out.data_ptr() % POINTER_ALIGN == 0 and torch.equal(out, x)


def test_requires_grad_inputs_are_detached():
    x = torch.randn(4, 8, requires_grad=True)
    out = prepare_args(SPEC, [x, torch.randn(8).bfloat16()], "cpu")[0]
    assert not out.requires_grad and out.data_ptr() == x.data_ptr()


def test_weights_are_checked_and_moved():
    bufs = [Buffer("w", "f32", (8,), "weight"), Buffer("x", "f32", (4, 8), "input")]
    w = torch.randn(8)
    out = prepare_weights(bufs, {"w": w}, "cpu")
    assert list(out) == ["w"] and torch.equal(out["w"], w)
    with pytest.raises(InputMismatch, match=r"weight w \(f32\[8\]\) was not given"):
        prepare_weights(bufs, {}, "cpu")
    with pytest.raises(InputMismatch, match=r"weight w has shape \(8,\) f16"):
        prepare_weights(bufs, {"w": w.half()}, "cpu")
