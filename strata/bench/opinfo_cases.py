"""PyTorch's OpInfo samples for the ops strata lowers, run through the whole pipeline on the
simulator: shared by tests/tensor/test_opinfo.py and `python -m strata.bench.opinfo_report`.

Every sample of every in-scope op (IN_SCOPE and MORE; CPU, float32 unless asked otherwise) is a
case, and so are its twins: the same sample with its tensors strided (`.nc`:
`SampleInput.noncontiguous()`, every other element, the skipped ones NaN, so a kernel that reads
the wrong element shows it) and stored transposed (`.t`). Zero-size and 0-d samples are cases
like any other. Each case must either pass `strata.bench.check.verify` (values against eager float64,
shape, dtype, output count; the Tensor IR evaluator is checked too) or raise a StrataError with
a clear sentence (an unsupported op, a data-dependent shape); a wrong result, a kernel NVRTC
rejects, a kernel the simulator catches racing or reading out of bounds, or any other exception
is a failure. One allowance: a float output is compared with the float64 reference rounded to
its own dtype when the plain comparison fails (a product of 125 numbers is 1e-57 in float64 and
0 in float32, as eager float32 gives; strata.bench.check counts that a relative error of 1).

Speed: torch.export and lowering have a fixed cost per program, so all cases of one op are
compiled as one program; a program that raises is split in halves until each error has its own
case, and a case that gives a wrong result in the group is run alone to confirm it (an error
that only shows with other samples is a failure too).
"""
from __future__ import annotations

import functools
import re
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..core import dtypes
from ..core.errors import CompileError, InputMismatch, SimError, StrataError
from ..kernel_ir.verify import verify_program
from ..runtime.nvrtc import compile_cuda
from ..tensor.eval import evaluate

# The first scope (issue 11): these ops, in these variants.
IN_SCOPE = """abs add addmm amax amin argmax argmin bmm cat ceil clamp clamp_max clamp_min clone
contiguous cos div eq erf exp exp2 expand expm1 flip floor floor_divide fmod full_like gather ge gt
index_select le lerp log log1p log_softmax logical_and logical_not logical_or logical_xor logsumexp
lt masked_fill matmul max maximum mean min minimum mm mul narrow ne neg nn.functional.embedding
nn.functional.gelu nn.functional.layer_norm nn.functional.linear nn.functional.normalize
nn.functional.relu nn.functional.rms_norm nn.functional.silu ones_like permute pow prod reciprocal
remainder repeat reshape roll round rsqrt select sigmoid sign sin slice softmax sqrt square
squeeze stack std std_mean sub sum t tanh transpose tril triu trunc unsqueeze var var_mean view
where zeros_like cumsum diff""".split()
VARIANTS = ("", "unbiased", "binary", "reduction_no_dim", "reduction_with_dim", "no_rounding_mode",
            "floor_rounding", "trunc_rounding", "multiple", "decimals_3", "with_dtype")
# Every other OpInfo (by op_id) of an op strata lowers (its README list: the activations, casts,
# splits, norms, einsum, attention, indexing ...), found by lowering each OpInfo's first samples.
# Left out: masked.* (a thousand samples of the same reductions), multi_head_attention_forward
# (576 samples of one composite), dropout (random), signal.windows (factories of aten.empty /
# linspace), conj / H / mH / real (complex views).
MORE = """__getitem__ __radd__ __rdiv__ __rmatmul__ __rmod__ __rmul__ __rpow__ __rsub__ T addcdiv
addcmul addmm.decomposed all any arange atleast_1d atleast_2d atleast_3d baddbmm bfloat16
bmm.triton_optimized bool broadcast_to byte cartesian_prod char chunk deg2rad diagonal
diagonal_copy dot double dsplit einsum expand_as expand_copy flatten float frac full half heaviside
hsplit index_copy index_put int isfinite isinf isnan isneginf isposinf linalg.diagonal
linalg.vector_norm log10 log2 logaddexp logit long mT movedim mv nan_to_num native_layer_norm
new_full new_ones new_zeros nn.functional.celu nn.functional.cosine_similarity nn.functional.elu
nn.functional.hardsigmoid nn.functional.hardswish nn.functional.hardtanh nn.functional.leaky_relu
nn.functional.mish nn.functional.relu6 nn.functional.scaled_dot_product_attention
nn.functional.selu nn.functional.softmin nn.functional.softmin.with_dtype nn.functional.softplus
nn.functional.softsign nn.functional.tanhshrink norm norm.fro norm.inf ones positive ravel
reshape_as rot90 round.decimals_0 round.decimals_neg_3 rsub scalar_tensor sgn short split
split.list_args split_with_sizes to true_divide unbind unflatten view_as view_copy vsplit xlogy
zeros""".split()
MATMUL = {"addmm", "bmm", "matmul", "mm", "nn.functional.linear"}   # contraction tolerance (1e-4)

PASSED, UNSUPPORTED, FAILED = "passed", "unsupported", "failed"


def op_id(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


@functools.lru_cache(maxsize=None)
def in_scope_ops() -> tuple:
    """The OpInfos of the in-scope ops and variants (imports torch's test internals)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return tuple(o for o in op_db if (o.name in IN_SCOPE and o.variant_test_name in VARIANTS)
                 or op_id(o) in MORE)


@dataclass
class Case:
    """One sample as a function of its tensors (every other argument is a constant of it)."""
    name: str                  # "sample3"; "sample3.nc", "sample3.t": its inputs non-contiguous
    fn: object
    inputs: tuple
    n_out: int                 # tensors eager returns
    what: str = ""             # the input shapes, for a failure message


@dataclass
class Outcome:
    case: str
    status: str                # PASSED, UNSUPPORTED or FAILED
    cause: str = ""            # the error sentence, or what was wrong
    what: str = ""


@dataclass
class OpResult:
    op: str
    outcomes: list = field(default_factory=list)
    excluded: list = field(default_factory=list)    # (case, why it is no case: eager rejects it)
    first: bool = True          # in the first scope (IN_SCOPE), not one of MORE

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)


def _describe(tensors) -> str:
    def one(t):
        shape = "x".join(map(str, t.shape)) or "0-d"
        dt = str(t.dtype).replace("torch.", "")
        return f"{shape} {dt}" + ("" if t.is_contiguous() else " strided")
    return ", ".join(one(t) for t in tensors)


def _case(op, sample, name: str):
    """A Case for one sample, or the reason it is none (eager itself rejects it, or it returns
    something other than tensors)."""
    import torch
    import torch.utils._pytree as pytree
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    tensors = tuple(leaves[k] for k in slots)

    def fn(*ts):
        vals = list(leaves)
        for k, t in zip(slots, ts):
            vals[k] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        out = op.op(inp, *args, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else out

    try:
        with torch.no_grad():
            out = fn(*tensors)
    except Exception as e:  # noqa: BLE001 -- eager rejects it (a view of a strided tensor)
        return f"eager raises {type(e).__name__}: {str(e).strip().splitlines()[0][:100]}"
    outs = out if isinstance(out, tuple) else (out,)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        return "returns a non-tensor"
    return Case(name, fn, tuple(t.detach() for t in tensors), len(outs), _describe(tensors))


def _transposable(t) -> bool:
    return t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1 and t.is_contiguous()


def _transposed(t):
    """`t`'s values stored column-major in its last two dimensions (strides swapped)."""
    import torch
    if isinstance(t, torch.Tensor) and _transposable(t):
        return t.mT.contiguous().mT
    return t


def cases(op, dtype=None) -> tuple[list[Case], list[tuple[str, str]]]:
    """(every sample of `op` as a Case, plus its twins where they differ: "sampleK.nc" with the
    tensors strided (`SampleInput.noncontiguous()`: every other element, the gaps NaN) and
    "sampleK.t" with them stored transposed; [(case, reason)] for samples that are no case)."""
    import torch
    import torch.utils._pytree as pytree
    out, excluded = [], []
    for k, sample in enumerate(op.sample_inputs("cpu", dtype or torch.float32)):
        variants = [(f"sample{k}", sample)]
        tensors = [x for x in pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
                   if isinstance(x, torch.Tensor)]
        if any(t.is_contiguous() and t.numel() > 1 for t in tensors):
            variants.append((f"sample{k}.nc", sample.noncontiguous()))
        if any(_transposable(t) for t in tensors):
            variants.append((f"sample{k}.t", sample.transform(_transposed)))
        for name, s in variants:
            c = _case(op, s, name)
            if isinstance(c, str):
                excluded.append((name, c))
            else:
                out.append(c)
    return out, excluded


def group_module(group: list[Case]):
    """Many cases as one module: its inputs are all the cases' tensors, its outputs all theirs."""
    import torch

    class Group(torch.nn.Module):
        def forward(self, *args):
            outs, start = [], 0
            for c in group:
                r = c.fn(*args[start:start + len(c.inputs)])
                start += len(c.inputs)
                outs += list(r) if isinstance(r, tuple) else [r]
            return tuple(outs)
    return Group()


def first_line(text: str, limit: int = 240) -> str:
    lines = str(text).strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _where(e: BaseException) -> str:
    """file:line of the innermost strata frame of an exception's traceback."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/strata/" in f.filename
              and "/bench/" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at strata/{f.filename.rsplit('/strata/', 1)[1]}:{f.lineno})"


def classify(e: BaseException) -> tuple[str, str]:
    """(status, cause) of an exception a case raised."""
    if isinstance(e, CompileError):
        return FAILED, "NVRTC rejected the CUDA: " + first_line(e)
    if isinstance(e, SimError):
        return FAILED, "simulator: " + first_line(e)
    if isinstance(e, InputMismatch):
        return FAILED, "the program rejects its own example inputs: " + first_line(e)
    if isinstance(e, StrataError):
        return UNSUPPORTED, first_line(e)
    return FAILED, f"{type(e).__name__}: {first_line(e)}{_where(e)}"


def _compile_and_check(group: list[Case], contraction: bool, nvrtc: bool, evaluator: bool):
    """Compile the group as one program, run it on the simulator and check it: a list with one
    (status, cause) per case, or an exception."""
    from . import check
    from ..api import compile as strata_compile
    flat = [t for c in group for t in c.inputs]     # as they are: strided ones stay strided
    module = group_module(group)
    module.input_names = [f"{c.name.replace('.', '_')}_{i}" for c in group
                          for i in range(len(c.inputs))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = strata_compile(module, flat)
        verify_program(program.lowered.kernel)
        if nvrtc and program.lowered.kernel.kernels:
            for unit in program.lowered.units.sources:     # each translation unit
                compile_cuda(unit, "sm_90", want="ptx")
        checks = check.verify(program, module, flat, contraction).outputs
    n_out = sum(c.n_out for c in group)
    if len(checks) != n_out:        # a wrong output count (or an input updated in place)
        bad = "; ".join(o.problem or o.name for o in checks[n_out:] if not o.passed)
        if len(group) == 1:
            return [(FAILED, f"wrong outputs: {bad}")]
        raise _Unattributed(bad)
    causes = [_cause(o) for o in checks]
    if any(causes) or evaluator:
        ref = _reference(module, flat)
        if any(cause.startswith("wrong values") for cause in causes):
            causes = _rounded(program, flat, checks, ref, causes)
        if evaluator:
            causes = _evaluated(program, flat, checks, ref, causes)
    verdicts, k = [], 0
    for c in group:
        mine, k = [x for x in causes[k:k + c.n_out] if x], k + c.n_out
        verdicts.append((FAILED, mine[0]) if mine else (PASSED, ""))
    return verdicts


def _cause(o) -> str:
    if o.passed:
        return ""
    if o.problem:
        return f"wrong shape or dtype: {o.problem}"
    return f"wrong values: {o.dtype} rel err {o.rel:.3g}, max abs err {o.max_abs:.3g} " \
           f"(tolerance {o.tol:g})"


def _reference(module, flat) -> list:
    """Eager's outputs in float64 (strata.bench.check's reference), as NumPy arrays."""
    import torch
    from . import check
    flat_out, _ = check.eager_run(module, [x.detach().clone() for x in flat])
    return [(t.detach().double() if t.is_floating_point() else t.detach()).numpy()
            if isinstance(t, torch.Tensor) else np.asarray(t) for t in flat_out]


def _in_dtype(ref, dtype: str):
    """The float64 reference as an output of `dtype` holds it: a float32 output cannot hold a
    value below float32's range (a product of 125 numbers, 1e-57: eager float32 gives 0 as strata
    does) or above it (inf), which strata.bench.check counts as errors of relative size 1."""
    import torch
    if not dtypes.is_float(dtype):
        return ref
    with np.errstate(over="ignore", under="ignore"):
        return torch.from_numpy(np.asarray(ref, dtype=np.float64)).to(
            dtypes.to_torch(dtype)).double().numpy()


def _rounded(program, flat, checks, ref, causes) -> list:
    """`causes` with each wrong value checked again against the reference in its own dtype."""
    import torch
    from . import check
    from ..api import to_numpy
    with torch.no_grad():
        got = torch.utils._pytree.tree_leaves(program(*[x.detach().clone() for x in flat]))
    out = list(causes)
    for i, (o, g, r) in enumerate(zip(checks, got, ref)):
        if out[i].startswith("wrong values"):
            again = check.compare(o.name, o.dtype, to_numpy(g), _in_dtype(r, o.dtype), o.tol)
            out[i] = _cause(again)
    return out


def _evaluated(program, flat, checks, ref, causes) -> list:
    """`causes` with the Tensor IR evaluator's (float64) outputs checked too."""
    from . import check
    from ..api import to_numpy
    tprog = program.lowered.tensor
    feed = {name: to_numpy(x) for name, x in zip(program.torch_program.inputs, flat)}
    values = evaluate(tprog, feed, "f64")
    out = list(causes)
    for i, (o, name, r) in enumerate(zip(checks, tprog.outputs, ref)):
        dt = tprog.node(name).type.dtype
        got = check.compare(o.name, dt, values[name], r, o.tol)     # it computes in float64
        if not got.passed:          # ... and rounds where the program casts
            got = check.compare(o.name, dt, values[name], _in_dtype(r, dt), o.tol)
        if not out[i] and not got.passed:
            out[i] = "Tensor IR evaluator: " + _cause(got)
    return out


class _Unattributed(Exception):
    """The group went wrong in a way no single case can be blamed for yet."""


class _Runner:
    """Runs groups of cases, splitting a group that raises until each error has its own case.
    After `max_failures` failed cases (None: no limit) the rest of a failing group is not split
    further: each of its cases is marked failed with the group's error (a compiler broken for
    every sample would otherwise cost two programs per sample)."""

    def __init__(self, contraction: bool, nvrtc: bool, evaluator: bool, max_failures=None):
        self.contraction, self.nvrtc, self.evaluator = contraction, nvrtc, evaluator
        self.max_failures = max_failures
        self.out: dict[str, Outcome] = {}

    def failures(self) -> int:
        return sum(o.status == FAILED for o in self.out.values())

    def give_up(self) -> bool:
        return self.max_failures is not None and self.failures() >= self.max_failures

    def record(self, c: Case, status: str, cause: str) -> None:
        self.out[c.name] = Outcome(c.name, status, cause, c.what)

    def run(self, group: list[Case]) -> None:
        try:
            verdicts = _compile_and_check(group, self.contraction, self.nvrtc, self.evaluator)
        except Exception as e:      # noqa: BLE001 -- every exception is a clear error or a bug
            status, cause = classify(e) if not isinstance(e, _Unattributed) else (FAILED, str(e))
            if len(group) == 1:
                self.record(group[0], status, cause)
            elif status == FAILED and self.give_up():
                for c in group:
                    self.record(c, FAILED, f"(not run alone) {cause}")
            else:
                half = len(group) // 2
                self.run(group[:half])
                self.run(group[half:])
                after = [self.out[c.name].status for c in group]
                if FAILED not in after and (status == FAILED or UNSUPPORTED not in after):
                    for c in group:             # the error shows only with other samples
                        if self.out[c.name].status == PASSED:
                            self.record(c, FAILED, f"(only with other samples) {cause}")
            return
        for c, (status, cause) in zip(group, verdicts):
            if status == FAILED and len(group) > 1 and not self.give_up():   # confirm it alone
                self.run([c])
                if self.out[c.name].status == PASSED:
                    self.record(c, FAILED, f"(only with other samples) {cause}")
            else:
                self.record(c, status, cause)


def run_op(op, nvrtc: bool = True, dtype=None, evaluator: bool = True,
           max_failures: int | None = None) -> OpResult:
    """Every case of `op` (samples of `dtype`, float32 by default) through strata.compile on the
    simulator, checked against eager; nvrtc: also compile each program's CUDA with NVRTC;
    evaluator: also check the Tensor IR evaluator's float64 outputs; max_failures: stop
    attributing failures to single samples after that many (see _Runner)."""
    import torch
    torch.manual_seed(0)
    with warnings.catch_warnings():     # eager's own (std with one element ...) are noise here
        warnings.simplefilter("ignore")
        all_cases, excluded = cases(op, dtype)
        result = OpResult(op_id(op), excluded=excluded, first=op_id(op) not in MORE)
        # a contraction's tolerance for the matmul ops; for the others strata.bench.check decides from
        # the program (an op that decomposes into aten.mm gets it too)
        runner = _Runner(True if op.name in MATMUL else None, nvrtc, evaluator, max_failures)
        if all_cases:
            runner.run(all_cases)
    result.outcomes = [runner.out[c.name] for c in all_cases]
    return result


def cause_key(cause: str) -> str:
    """A failure or error cause with what differs between samples (numbers, names, the user's
    line) taken out, so that equal causes group together; a failure keeps the strata line."""
    key = re.sub(r"^\((not run alone|only with other samples)\) ", "", cause)
    key = re.sub(r" ?`[^`]*`", "", key)
    key = re.sub(r" \(at (?!strata/)[^)]*\)$", "", key)
    key = re.sub(r"rel err [^,]+, max abs err \S+", "rel err N, max abs err N", key)
    key = re.sub(r"\(\d+(, \d+)*,?\)", "(shape)", key)
    key = re.sub(r"\bu\d+(?=[})])", "uN", key)        # torch's unbacked symbols: {u0}, u2)
    return key
