"""OpInfo parity: PyTorch's own op samples give the same results on "tpu" as on CPU.

Default run: `FAST_OPS` (a representative subset, a few samples each) in float32 with
gradients, and a few ops in bfloat16, int64 and bool. `-m slow`: every OpInfo entry in
float32 with gradients, and a sampled forward pass in bfloat16, int64 and bool.
The comparison rules, the skip list (every entry has a reason) and the known failures
live in `opinfo_harness.py`; `python -m tests.tpu_backend.opinfo_report` prints the table.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from tests.tpu_backend import opinfo_harness as harness

if harness.DEVICE != "cpu":
    import tpu_backend  # noqa: F401 - registers the device

ALL_OP_IDS = sorted(harness.ops_by_id())
FAST_SAMPLES = 3
# Ops checked in the other dtypes by default: cheap, and each dtype's promotion rules differ.
FAST_OTHER_DTYPE_OPS = ("add", "mul", "sum", "where", "eq", "cat", "mm", "amax", "__getitem__", "clamp")
OTHER_DTYPES = (torch.bfloat16, torch.int64, torch.bool)


def run_and_assert(op_name: str, dtype: torch.dtype, max_samples: int | None, check_grad: bool, known_failures=None):
    op = harness.ops_by_id()[op_name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # OpInfo samples call deprecated ops on purpose
        result = harness.check_op(op, dtype, max_samples=max_samples, check_grad=check_grad)
    if result.status in ("skip", "n/a"):
        pytest.skip(result.detail)
    known = (known_failures or {}).get(op_name)
    if known is not None and not result.ok:
        # xfail only for the recorded error: a new bug in a known-failing op must fail
        assert known.matches(result), (
            f"{op_name} ({dtype}) fails differently from its KNOWN_FAILURES entry:\n"
            f"  recorded: {known.error}\n  now:      {result.signature}\n  {result.detail} {result.where}"
        )
        pytest.xfail(f"{known.reason} ({known.error})")
    # a known failure that passes (fixed, or its sample lies beyond max_samples) passes
    assert result.ok, f"{op_name} ({dtype}): {result.status}: {result.detail} {result.where}"
    assert result.samples > 0, f"{op_name} ({dtype}): OpInfo gave no samples"


@pytest.mark.parametrize("op_name", harness.FAST_OPS)
def test_fast_ops_float32_forward_and_grad(op_name):
    run_and_assert(op_name, torch.float32, FAST_SAMPLES, check_grad=True, known_failures=harness.KNOWN_FAILURES)


@pytest.mark.parametrize("dtype", OTHER_DTYPES, ids=str)
@pytest.mark.parametrize("op_name", FAST_OTHER_DTYPE_OPS)
def test_fast_ops_other_dtypes_forward(op_name, dtype):
    known = harness.KNOWN_FAILURES_BY_DTYPE.get(dtype, {})
    run_and_assert(op_name, dtype, 2, check_grad=False, known_failures=known)


@pytest.mark.slow
@pytest.mark.parametrize("op_name", ALL_OP_IDS)
def test_all_ops_float32_forward_and_grad(op_name):
    run_and_assert(op_name, torch.float32, None, check_grad=True, known_failures=harness.KNOWN_FAILURES)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", OTHER_DTYPES, ids=str)
@pytest.mark.parametrize("op_name", ALL_OP_IDS)
def test_all_ops_other_dtypes_forward(op_name, dtype):
    known = harness.KNOWN_FAILURES_BY_DTYPE.get(dtype, {})
    run_and_assert(op_name, dtype, 2, check_grad=False, known_failures=known)


def test_every_listed_op_exists_and_has_a_reason():
    """The skip, shape-only, known-failure and fast lists name real OpInfo entries."""
    lists = {
        "SKIPS": harness.SKIPS,
        "SHAPE_ONLY": harness.SHAPE_ONLY,
        "KNOWN_FAILURES": harness.KNOWN_FAILURES,
        **{f"KNOWN_FAILURES_BY_DTYPE[{d}]": v for d, v in harness.KNOWN_FAILURES_BY_DTYPE.items()},
    }
    ops = harness.ops_by_id()
    for list_name, entries in lists.items():
        for name, entry in entries.items():
            assert name in ops.keys(), f"{list_name} names {name!r}, which is not an OpInfo entry"
            reason = entry.reason if isinstance(entry, harness.KnownFailure) else entry
            assert reason.strip(), f"{list_name}[{name!r}] has no reason"
            if isinstance(entry, harness.KnownFailure):
                assert entry.error.startswith(("fail at sample ", "mismatch at sample ")), (
                    f"{list_name}[{name!r}] records no error signature: {entry.error!r}"
                )
    for list_name in ("KNOWN_FAILURES", *[k for k in lists if k.startswith("KNOWN_FAILURES_BY_DTYPE")]):
        assert all(isinstance(e, harness.KnownFailure) for e in lists[list_name].values()), list_name
    missing = [name for name in harness.FAST_OPS + FAST_OTHER_DTYPE_OPS if name not in ops]
    assert not missing, f"not OpInfo entries: {missing}"


def test_known_failure_matches_only_its_recorded_error():
    """An xfail is tied to the exact error: another sample, message or mismatch size fails."""
    recorded = harness.OpResult(
        "op", torch.float32, "mismatch", failed_sample=2, message="Mismatch: grad[0]: 1e-4 at (0,)"
    )
    known = harness.KnownFailure(recorded.signature, "reason")
    assert known.matches(recorded)
    for changed in (
        harness.OpResult("op", torch.float32, "mismatch", failed_sample=0, message=recorded.message),
        harness.OpResult("op", torch.float32, "mismatch", failed_sample=2, message="Mismatch: grad[0]: 374 at (0,)"),
        harness.OpResult("op", torch.float32, "fail", failed_sample=2, message=recorded.message),
    ):
        assert not known.matches(changed), changed.signature


def test_tied_indices_count_only_when_they_pick_equal_values():
    """TIE_INVARIANT: another index of an equal value is taken as CPU's; an index of another
    value, or one element picked twice, is left to fail the comparison."""
    x = torch.tensor([[3, 1, 3, 2, 1]])
    topk = types.SimpleNamespace(input=x, args=(2, -1), kwargs={})
    expected = torch.topk(x, 2)
    align = lambda got, sample, name: harness._align_tied_indices(
        got, expected_of[name], sample, harness.TIE_INVARIANT[name]
    )
    expected_of = {"topk": expected, "mode": torch.mode(x[0]), "kthvalue": torch.kthvalue(x[0], 2, 0)}
    tied = (expected.values, expected.indices.flip(-1))
    assert torch.equal(align(tied, topk, "topk")[1], expected.indices)
    for wrong in (torch.tensor([[0, 1]]), torch.tensor([[2, 2]])):
        assert torch.equal(align((expected.values, wrong), topk, "topk")[1], wrong)
    one_d = types.SimpleNamespace(input=x[0], args=(), kwargs={})
    assert align((torch.tensor(1), torch.tensor(1)), one_d, "mode")[1] == expected_of["mode"].indices  # 1 at 1 or 4
    assert align((torch.tensor(1), torch.tensor(3)), one_d, "mode")[1] == 3  # x[3] == 2
    kth = types.SimpleNamespace(input=x[0], args=(2, 0), kwargs={})
    assert align((torch.tensor(1), torch.tensor(1)), kth, "kthvalue")[1] == expected_of["kthvalue"].indices


def test_bfloat16_mismatch_is_judged_against_float64():
    """A bfloat16 result off CPU's passes only if it is as close to the float64 value."""
    op = harness.ops_by_id()["sum"]
    x = torch.randn(4000, generator=torch.Generator().manual_seed(0)).bfloat16()
    sample = types.SimpleNamespace(input=x, args=(), kwargs={}, output_process_fn_grad=lambda out: out)
    mismatch = harness.Mismatch("output[0]: Tensor-likes are not close!")
    notes = []
    nearest = x.double().sum().bfloat16()
    harness._judge_by_float64(op, sample, 0, mismatch, notes, actual=nearest, expected=op(x))
    assert notes and notes[0].startswith("output: bfloat16 rounding"), notes
    with pytest.raises(harness.Mismatch, match="vs float64: device error"):
        harness._judge_by_float64(op, sample, 0, mismatch, [], actual=nearest + 4, expected=op(x))


@pytest.mark.skipif(harness.DEVICE == "cpu", reason="checks the device's lowering")
@pytest.mark.parametrize("spatial", (2, 3))
def test_fractional_max_pool_matches_cpu_for_given_samples(spatial):
    """OpInfo compares fractional max pooling by shape only (it draws its window offsets);
    with the offsets given, values and indices must match CPU exactly."""
    torch.manual_seed(0)
    x = torch.randn((2, 3, 9, 8, 7)[: 2 + spatial])
    samples = torch.rand(2, 3, spatial)
    pool = torch.ops.aten.fractional_max_pool2d if spatial == 2 else torch.ops.aten.fractional_max_pool3d
    kernel, output = (2, 3, 2)[:spatial], (4, 3, 2)[:spatial]
    want_values, want_indices = pool(x, kernel, output, samples)
    got_values, got_indices = pool(x.to(harness.DEVICE), kernel, output, samples.to(harness.DEVICE))
    torch.testing.assert_close(got_values.cpu(), want_values, rtol=0, atol=0)
    torch.testing.assert_close(got_indices.cpu(), want_indices, rtol=0, atol=0)


def _sample(input, *args, **kwargs):
    return {"input": input, "args": args, "kwargs": kwargs}


def _wrong_random_outputs():
    """(entry, sample arguments, an output a broken sampler could give): each must be rejected."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 50, generator=g)
    kept = torch.rand(40, 50, generator=g) < 0.5
    channel_kept = (torch.rand(4, 5, 1, 1, generator=g) < 0.5).expand(4, 5, 6, 6)
    y = torch.randn(4, 5, 6, 6, generator=g)
    return [
        ("uniform", _sample(x, 0, 1), torch.rand(40, 50, generator=g) + 0.5),  # outside [0, 1]
        ("uniform", _sample(x, 0, 1), torch.rand(40, 50, generator=g) * 0.9),  # support right, mean off
        ("normal.in_place", _sample(x, 2.0, 0.5), 2.0 + torch.randn(40, 50, generator=g)),  # std 1, not 0.5
        ("normal", _sample(torch.zeros(40, 50), 1.0), torch.randn(40, 50, generator=g) + 0.2),  # mean shifted
        ("exponential", _sample(x, 3.0), torch.empty(40, 50).exponential_(1.0, generator=g)),  # rate 1, not 3
        ("bernoulli", _sample(torch.full((40, 50), 0.2)), torch.rand(40, 50, generator=g).lt(0.3).float()),
        ("randint", _sample(3, 10, (40, 50)), torch.randint(3, 11, (40, 50), generator=g)),  # includes high
        ("multinomial", _sample(torch.ones(2, 6), 3, replacement=False), torch.tensor([[0, 1, 1], [2, 3, 4]])),
        ("nn.functional.dropout", _sample(x, p=0.5, training=True), x * kept),  # kept values not scaled by 2
        ("nn.functional.dropout", _sample(x, p=0.5, training=True), x * 2 * (torch.rand(40, 50) < 0.8)),  # keeps 80%
        ("nn.functional.dropout", _sample(x, p=0.5, training=False), x * 2 * kept),  # dropped in eval
        ("nn.functional.dropout2d", _sample(y, p=0.5, training=True), y * 2 * (torch.rand(4, 5, 6, 6) < 0.5)),
        (  # values that are not the input at the returned indices
            "nn.functional.fractional_max_pool2d",
            _sample(y, 2, output_size=3, return_indices=True),
            (y.reshape(20, 36)[:, :9].reshape(4, 5, 3, 3), (torch.arange(9) + 1).expand(4, 5, 9).reshape(4, 5, 3, 3)),
        ),
        ("nn.functional.fractional_max_pool2d", _sample(y, 2, output_size=3), y[..., :3, :3] + 1),  # not in the input
        ("nn.functional.rrelu", _sample(x, lower=0.1, upper=0.3, training=True), x.where(x > 0, x * 0.35)),
        ("nn.functional.rrelu", _sample(x, lower=0.1, upper=0.3, training=False), x.where(x > 0, x * 0.1)),
        ("nn.functional.dropout2d", _sample(y, p=0.5, training=True), y * 2 * channel_kept),  # right: the control
    ]


def test_random_value_checks_reject_wrong_samplers():
    """The distribution checks that make a random entry count as value-checked can fail."""
    from tests.tpu_backend.opinfo_random import RANDOM_CHECKS, RandomCheckFailed

    cases = _wrong_random_outputs()
    for name, args, out in cases[:-1]:
        with pytest.raises(RandomCheckFailed):
            RANDOM_CHECKS[name](args, *(out if isinstance(out, tuple) else (out,)))
    name, args, out = cases[-1]
    RANDOM_CHECKS[name](args, out)  # control: a per-channel mask with the right scaling passes


class _UnseededRandnLike:
    """A random op that ignores torch's seed (its own generator keeps advancing)."""

    name, variant_test_name = "randn_like", ""

    def __init__(self):
        self.generator = torch.Generator().manual_seed(0)

    def __call__(self, x):
        return torch.randn(x.shape, generator=self.generator).to(x.device)


def test_random_entries_must_follow_the_seed():
    from torch.testing._internal.opinfo.core import SampleInput

    sample = SampleInput(torch.zeros(30, 30))
    pristine = (sample.input.clone(), (), {})
    op = _UnseededRandnLike()
    with pytest.raises(harness.Mismatch, match="the same seed gave different values"):
        harness._check_random_values(op, sample, pristine, op(sample.input.to(harness.DEVICE)), seed=0)
