"""tensor/merge_projections.py: sibling linears of one input become one linear over their
weights concatenated, each former output a slice; results match eager, a source weight changed
later is seen, and what must not merge does not."""
import pytest
import torch

import strata


class Attention(torch.nn.Module):
    """q, k, v of one input (GQA-sized k and v), as a decoder layer has them."""

    def __init__(self, bias=False):
        super().__init__()
        self.q = torch.nn.Linear(64, 64, bias=bias)
        self.k = torch.nn.Linear(64, 16, bias=bias)
        self.v = torch.nn.Linear(64, 16, bias=bias)

    def forward(self, x):
        return self.q(x) * 2, self.k(x) + 1, self.v(x)


def _linears(prog):
    return [n for n in prog.lowered.torch.nodes if n.packet == "aten.linear"]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("device", ["sim", "cpu"])
def test_siblings_run_as_one_linear_and_match_eager(bias, device):
    m, x = Attention(bias), torch.randn(3, 5, 64)
    with torch.no_grad():
        prog = strata.compile(m, (x,), device=device)
        got, want = prog(x), m(x)
    (linear,) = _linears(prog)
    tp = prog.lowered.torch
    assert linear.type.shape == (3, 5, 96) and tp.derived[linear.args[1].name] == (
        "p_q_weight", "p_k_weight", "p_v_weight")
    assert "= cat(p_q_weight, p_k_weight, p_v_weight)" in prog.ir("torch")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_a_source_weight_changed_later_is_seen():
    m, x = Attention(), torch.randn(1, 64)
    with torch.no_grad():
        prog = strata.compile(m, (x,), device="cpu")
        prog(x)
        m.k.weight.mul_(-3)
        prog.set_weights({"p_k_weight": m.k.weight})
        for g, w in zip(prog(x), m(x)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_programs_of_one_module_share_the_concatenated_weights():
    """One concatenation per set of weights and versions, whatever the number of programs (one per
    cache length under torch.compile's dynamic KV cache); a weight updated in place since is
    concatenated again, and a program made before keeps what it was made from."""
    m = Attention()

    def merged(rows):
        prog = strata.compile(m, (torch.randn(rows, 64),), device="sim")
        (name,) = prog.lowered.torch.derived
        return prog, prog.lowered.torch.weights[name]
    with torch.no_grad():
        (_, a), (_, b) = merged(1), merged(3)
        assert a is b
        m.k.weight.mul_(-3)
        _, c = merged(3)
        assert c is not a and torch.equal(c[64:80], m.k.weight) and not torch.equal(a[64:80], c[64:80])
        other = Attention()                 # another module's weights: a concatenation of its own
        prog = strata.compile(other, (torch.randn(1, 64),), device="sim")
        assert prog.lowered.torch.weights[next(iter(prog.lowered.torch.derived))] is not c


def test_what_must_not_merge_stays_apart():
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 8)                  # a bias
            self.b = torch.nn.Linear(64, 8, bias=False)      # none
            self.c = torch.nn.Linear(32, 8, bias=False)      # another input

        def forward(self, x, y, w):
            return self.a(x), self.b(x), self.c(y), torch.nn.functional.linear(x, w)

    m = Mixed()
    inputs = (torch.randn(2, 64), torch.randn(2, 32), torch.randn(8, 64))  # w: an input
    with torch.no_grad():
        prog = strata.compile(m, inputs, device="sim")
        got, want = prog(*inputs), m(*inputs)
    assert len(_linears(prog)) == 4 and not prog.lowered.torch.derived
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_torch_compile_sees_a_changed_parameter_of_a_merged_projection():
    m, x = Attention(), torch.randn(2, 64)
    compiled = torch.compile(m, backend="strata")
    with torch.no_grad():
        compiled(x)
        m.v.weight.add_(1.0)
        for g, w in zip(compiled(x), m(x)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_many_rows_stay_apart():
    """Above MAX_ROWS rows (a prefill) the projections stay separate: merged they ran slower."""
    from strata.tensor.merge_projections import MAX_ROWS
    x = torch.randn(1, MAX_ROWS + 1, 64)
    with torch.no_grad():
        prog = strata.compile(Attention(), (x,), device="sim")
    assert len(_linears(prog)) == 3 and not prog.lowered.torch.derived


def test_a_weight_shared_by_two_inputs_and_read_twice():
    """One module applied to two inputs makes two groups headed by the same weight (their merged
    weights are named apart); a linear repeating a weight of its group stays apart."""
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attention()

        def forward(self, x, y):
            return (*self.attn(x), *self.attn(y), self.attn.q(x) - 1)

    m, inputs = Twice(), (torch.randn(2, 64), torch.randn(3, 64))
    with torch.no_grad():
        prog = strata.compile(m, inputs, device="sim")
        got, want = prog(*inputs), m(*inputs)
    derived = prog.lowered.torch.derived
    assert len(derived) == 2 and len(_linears(prog)) == 3
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


class QuantAttention(torch.nn.Module):
    """q, k, v as QuantLinears (a GGUF model's): each dequantizes its own blocks."""

    def __init__(self, fmts, k=256):
        super().__init__()
        from strata.quant.formats import QuantLinear
        torch.manual_seed(0)
        self.q, self.k, self.v = (QuantLinear.from_linear(torch.nn.Linear(k, n, bias=False), f)
                                  for n, f in zip((64, 16, 16), fmts))

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x)


def _rel(got, want):
    return max(((g.double() - w.double()).norm() / w.double().norm()).item() for g, w in zip(got, want))


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0", "q4_k", "q6_k"])
@pytest.mark.parametrize("device", ["sim", "cpu"])
def test_quantized_siblings_dequantize_their_blocks_concatenated(fmt, device):
    """Their dequantizations compute alike, row by row (tensor/weight_chains.py): one chain over
    each part concatenated, one linear; bf16, so the CPU's rows take int8 activations."""
    m = QuantAttention((fmt,) * 3).to(torch.bfloat16)
    x = torch.randn(1, 256).to(torch.bfloat16)
    with torch.no_grad():
        prog = strata.compile(m, (x,), device=device)
        got, want = prog(x), m(x)
    (linear,) = _linears(prog)
    assert linear.type.shape == (1, 96)
    assert "= cat(b_q_qs, b_k_qs, b_v_qs)" in prog.ir("torch")
    assert _rel(got, want) < 1.5e-2


def test_quantized_siblings_of_other_formats_or_read_elsewhere_stay_apart():
    """A Q6_K v beside Q4_K q and k (llama.cpp's Q4_K_M mix) merges q and k only; a dequantized
    weight the program also returns is not merged; f32 rows match eager to float rounding."""
    m, x = QuantAttention(("q4_k", "q4_k", "q6_k")), torch.randn(1, 256)
    with torch.no_grad():
        prog = strata.compile(m, (x,), device="cpu")
        got, want = prog(x), m(x)
    assert sorted(n.type.shape[-1] for n in _linears(prog)) == [16, 80]
    assert _rel(got, want) < 1e-5

    class Returned(QuantAttention):
        def forward(self, x):
            w = self.k.weight(x.dtype)          # read by k's product and returned
            return self.q(x), torch.nn.functional.linear(x, w), w

    m = Returned(("q4_0",) * 3)
    with torch.no_grad():
        prog = strata.compile(m, (x,), device="sim")
        got, want = prog(x), m(x)
    assert len(_linears(prog)) == 2 and not prog.lowered.torch.derived
    assert _rel(got, want) < 1e-5


def test_a_changed_block_of_a_merged_quantized_projection_is_seen():
    m, x = QuantAttention(("q4_0",) * 3), torch.randn(1, 256)
    with torch.no_grad():
        prog = strata.compile(m, (x,), device="cpu")
        prog(x)
        m.k.d.mul_(-3)
        prog.set_weights({"b_k_d": m.k.d})
        assert _rel(prog(x), m(x)) < 1e-5
