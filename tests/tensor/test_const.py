"""Tensors made from constants: Full and Iota nodes."""
import torch

from tensor_helpers import check_cases, rnd


def test_constants():
    x = rnd(3, 4)
    check_cases({
        "full": (lambda x: (x + torch.full((3, 4), 2.5), torch.zeros(4) + x, torch.ones(3, 1) * x), (x,)),
        "like": (lambda x: (torch.zeros_like(x), torch.ones_like(x) + x, torch.full_like(x, 7),
                            x.new_zeros(2), x.new_ones(3, 2)), (x,)),
        "arange": (lambda x: (torch.arange(4) + x, torch.arange(1, 9, 2), torch.arange(0.5, 3.0, 0.25),
                              torch.arange(5, dtype=torch.float32), torch.arange(10, 0, -3)), (x,)),
        "scalar": (lambda x: (x + torch.tensor(3.0), torch.scalar_tensor(2.0) * x,
                              x * torch.tensor([1.0, 2.0, 3.0, 4.0])), (x,)),
        "int_full": (lambda x: torch.full((2, 2), 3, dtype=torch.int64) + 1, (x,)),
    })
