"""The mistakes users make every day raise on the tpu what PyTorch raises on CPU.

Each case runs on CPU and on the tpu (strict, fused and debug modes; the other dispatch
path runs this file too, tests/tpu_backend/test_native.py): the same exception type, and
the tpu's message starts with CPU's, so it names the same shapes and dtypes.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings

import jax
import pytest
import torch
import torch.nn.functional as F

import tpu_backend
from tests.tpu_backend import opinfo_harness
from tpu_backend import fused
from tpu_backend import tensor as tpu_tensor
from tpu_backend.eager import runner as runner_module
from tpu_backend.eager.errors import out_of_memory


def ones(device, *shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype).to(device)


# name -> the failing call on `device`
CASES = {
    "add operator, shapes do not broadcast": lambda d: ones(d, 3) + ones(d, 4),
    "torch.add": lambda d: torch.add(ones(d, 3), ones(d, 4)),
    "mul operator, 2-d": lambda d: ones(d, 2, 3) * ones(d, 3, 2),
    "where": lambda d: torch.where(ones(d, 3) > 0, ones(d, 3), ones(d, 5)),
    "in-place add, shapes do not broadcast": lambda d: ones(d, 3).add_(ones(d, 4)),
    "matmul operator, inner dimensions": lambda d: ones(d, 2, 3) @ ones(d, 4, 5),
    "torch.mm": lambda d: torch.mm(ones(d, 2, 3), ones(d, 4, 5)),
    "torch.matmul, batched": lambda d: torch.matmul(ones(d, 2, 2, 3), ones(d, 2, 4, 5)),
    "torch.bmm": lambda d: torch.bmm(ones(d, 2, 2, 3), ones(d, 2, 4, 5)),
    "F.linear": lambda d: F.linear(ones(d, 2, 3), ones(d, 4, 5)),
    "nn.Linear, wrong in_features": lambda d: torch.nn.Linear(5, 4).to(d)(ones(d, 2, 3)),
    "conv2d, wrong channels": lambda d: F.conv2d(ones(d, 1, 3, 8, 8), ones(d, 4, 2, 3, 3)),
    "cat, sizes differ": lambda d: torch.cat([ones(d, 2, 3), ones(d, 2, 4)]),
    "view, wrong element count": lambda d: ones(d, 6).view(4, 4),
    "in-place add of a float into an int tensor": lambda d: ones(d, 3, dtype=torch.long).add_(ones(d, 3)),
    "in-place mul by a Python float of an int tensor": lambda d: ones(d, 3, dtype=torch.int32).mul_(0.5),
    "index out of range": lambda d: ones(d, 3)[10],
}

# Indices held in tensors: checked against the sizes in debug mode (strict and fused modes
# would wait for the chip at every indexing op to look: docs/tpu.md)
INDEX_CASES = {
    "index_select": lambda d: torch.index_select(ones(d, 3), 0, torch.tensor([5]).to(d)),
    "gather": lambda d: torch.gather(ones(d, 3), 0, torch.tensor([5]).to(d)),
    "embedding": lambda d: F.embedding(torch.tensor([[1, 7]]).to(d), ones(d, 3, 2)),
    "indexing with a tensor": lambda d: ones(d, 3)[torch.tensor([10]).to(d)],
}


def _raised(call, device: str) -> BaseException:
    with pytest.raises(Exception) as caught:
        result = call(device)
        if isinstance(result, torch.Tensor):
            result.cpu()  # fused mode: run what was recorded
    return caught.value


def _same_as_cpu(call) -> None:
    expected, got = _raised(call, "cpu"), _raised(call, "tpu")
    assert type(got) is type(expected), f"tpu raised {type(got).__name__}: {got}; CPU raised {expected!r}"
    assert str(got).startswith(str(expected)), f"tpu: {got}\nCPU: {expected}"


@pytest.fixture(params=["strict", "fused", "debug"])
def mode(request):
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode(request.param)
    yield request.param
    tpu_backend.set_eager_mode(previous)


def test_every_case_raises_what_cpu_raises(mode):
    for name, call in CASES.items():
        try:
            _same_as_cpu(call)
        except AssertionError as failure:
            raise AssertionError(f"{name} ({mode} mode): {failure}") from None
    # and the device still works after every one of them
    assert (ones("tpu", 3) + ones("tpu", 3)).cpu().tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("name", list(INDEX_CASES))
def test_tensor_indices_out_of_range_raise_in_debug_mode(name):
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode("debug")
    try:
        _same_as_cpu(INDEX_CASES[name])
    finally:
        tpu_backend.set_eager_mode(previous)


def test_a_cpu_tensor_mixed_in_raises_what_cuda_raises(mode):
    for call in (lambda: ones("tpu", 3) + torch.ones(3), lambda: torch.mm(torch.ones(2, 3), ones("tpu", 3, 2))):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*tpu:0 and cpu"):
            call()
    # a 0-dim CPU tensor is a scalar, as with CUDA tensors
    assert (ones("tpu", 2) * torch.tensor(3.0)).cpu().tolist() == [3.0, 3.0]


def test_cpu_index_tensors_index_a_device_tensor_as_on_cuda(mode):
    """Advanced indexing is where CUDA takes CPU tensors beside device ones (BEiT indexes
    its position table with indices made on the host): read, written, accumulated and
    differentiated as on CPU."""
    table, index = torch.randn(10, 3), torch.tensor([1, 4, 4, 9])
    on_device = table.to("tpu").requires_grad_()
    read = on_device[index]
    read.backward(torch.arange(12.0).reshape(4, 3).to("tpu"))
    expected = table.clone().requires_grad_()
    expected[index].backward(torch.arange(12.0).reshape(4, 3))
    assert torch.equal(read.detach().cpu(), table[index])
    assert torch.equal(on_device.grad.cpu(), expected.grad)
    written, cpu = torch.zeros(10, 3, device="tpu"), torch.zeros(10, 3)
    written[index] = torch.ones(4, 3, device="tpu")
    cpu[index] = torch.ones(4, 3)
    written.index_put_((index,), torch.ones(4, 3, device="tpu"), accumulate=True)
    cpu.index_put_((index,), torch.ones(4, 3), accumulate=True)
    assert torch.equal(written.cpu(), cpu)


def _exhausted(message: str) -> jax.errors.JaxRuntimeError:
    return jax.errors.JaxRuntimeError(message)


COMPILE_OUT_OF_MEMORY = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
    "Used 17.13G of 15.48G hbm. Exceeded hbm capacity by 1.65G."
)
CHIP_OUT_OF_MEMORY = (
    "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 129.50M. "
    "That was not possible. There are 78.17M free.; (0x0x0_HBM0)"
)


@pytest.mark.parametrize(
    "message, asked, free",
    [
        (CHIP_OUT_OF_MEMORY, int(129.5 * 2**20), int(78.17 * 2**20)),
        (
            COMPILE_OUT_OF_MEMORY,
            int(17.13 * 2**30),
            int(15.48 * 2**30),
        ),
        (
            "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
            "(301.57G) exceeds available HBM (15.75G).",
            int(301.57 * 2**30),
            int(15.75 * 2**30),
        ),
    ],
)
def test_xla_out_of_memory_reads_as_torch_out_of_memory(message, asked, free):
    oom = out_of_memory(_exhausted(message))
    assert isinstance(oom, torch.OutOfMemoryError)
    assert (oom.requested_bytes, oom.free_bytes) == (asked, free)
    assert f"Tried to allocate {asked / 2**20:.2f} MiB" in str(oom)
    assert out_of_memory(_exhausted("INTERNAL: something else")) is None


def test_the_chip_running_out_of_memory_raises_torch_out_of_memory(monkeypatch):
    """Simulated (no chip here): an op whose program cannot allocate, a tensor moved to a full
    chip, and fused mode's step program."""

    def exhausted(*args, **kwargs):
        raise _exhausted(CHIP_OUT_OF_MEMORY)

    a = ones("tpu", 3)
    monkeypatch.setattr(runner_module, "_run_jitted", exhausted)  # both dispatch paths call it when wrapped
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 129.50 MiB; the chip has 78.17 MiB free"):
        a + a
    monkeypatch.undo()

    monkeypatch.setattr(tpu_tensor.jax, "device_put", exhausted)  # the host -> device transfer
    with pytest.raises(torch.OutOfMemoryError, match="129.50 MiB"):
        torch.ones(3).to("tpu")
    with pytest.raises(torch.OutOfMemoryError, match="129.50 MiB"):
        torch.ones(3).to("tpu", non_blocking=True)
    monkeypatch.undo()

    class Unfit:  # fused mode: the step's one program
        program = staticmethod(exhausted)

    tpu_backend.set_eager_mode("fused")
    try:
        monkeypatch.setattr(fused, "_compiled_for", lambda *args: Unfit)
        with pytest.raises(torch.OutOfMemoryError, match="129.50 MiB"):
            (a * 2).cpu()
    finally:
        monkeypatch.undo()
        tpu_backend.set_eager_mode("strict")
    assert (a * 2).cpu().tolist() == [2.0, 2.0, 2.0]


def test_a_compiled_program_the_chip_cannot_hold_raises_torch_out_of_memory(monkeypatch):
    """Simulated: torch.compile's programs (Trainer's step on the device) whose compile finds
    the chip too small for a batch above 4. PyTorch's OutOfMemoryError, as for eager ops (it
    was XLA's error): accelerate's `find_executable_batch_size`, what Trainer's
    `auto_find_batch_size` runs, lowers the batch on it until one fits."""
    import accelerate

    from tpu_backend.compile.program import Program

    build = Program._build

    def build_up_to_four_rows(self, key, args):
        if any(len(getattr(a, "shape", ())) == 2 and a.shape[0] > 4 for a in args):
            raise _exhausted(COMPILE_OUT_OF_MEMORY)
        return build(self, key, args)

    monkeypatch.setattr(Program, "_build", build_up_to_four_rows)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    tried = []

    @accelerate.utils.find_executable_batch_size(starting_batch_size=16)
    def run(batch_size):
        tried.append(batch_size)
        return compiled(torch.ones(batch_size, 8, device="tpu")).cpu()

    torch.testing.assert_close(run(), model(torch.ones(4, 8)))
    assert tried[0] == 16 and tried[-1] == 4 and min(tried[:-1]) > 4, tried


def _index(device, *values):
    return torch.tensor(values, device=device)


# Calls PyTorch refuses whose lowering JAX would have broadcast or clamped into a result:
# `index_copy_` of a (2, 1, 2, 3) source into (2, 4, 8, 3) slices (a static cache written with
# the wrong head count) filled every head with the one given.
REFUSED_NOT_BROADCAST = {
    "index_copy_": lambda d: torch.zeros(2, 4, 8, 3, device=d).index_copy_(
        2, _index(d, 0, 1), torch.ones(2, 1, 2, 3, device=d)
    ),
    "index_add_": lambda d: torch.zeros(2, 4, 8, 3, device=d).index_add_(
        2, _index(d, 0, 1), torch.ones(2, 1, 2, 3, device=d)
    ),
    "index_add_ (fewer rows)": lambda d: torch.zeros(4, 3, device=d).index_add_(
        0, _index(d, 0, 1), torch.ones(1, 3, device=d)
    ),
    "slice_scatter": lambda d: torch.slice_scatter(torch.zeros(4, 3, device=d), torch.ones(1, 3, device=d), 0, 0, 2),
    "select_scatter": lambda d: torch.select_scatter(torch.zeros(4, 3, device=d), torch.ones(1, device=d), 0, 0),
    "diagonal_scatter": lambda d: torch.diagonal_scatter(torch.zeros(3, 3, device=d), torch.ones(1, device=d)),
    "scatter_ (index past src)": lambda d: torch.zeros(4, 3, device=d).scatter_(
        0, torch.zeros(2, 3, dtype=torch.long, device=d), torch.ones(1, 3, device=d)
    ),
    "gather (index past x)": lambda d: torch.zeros(2, 3, device=d).gather(
        0, torch.zeros(2, 4, dtype=torch.long, device=d)
    ),
    "index_select (2-d index)": lambda d: torch.zeros(4, 3, device=d).index_select(0, _index(d, [0])),
    "layer_norm (other normalized shape)": lambda d: F.layer_norm(torch.zeros(2, 3, device=d), (4,)),
    "add_ (a result larger than self)": lambda d: torch.zeros(1, 3, device=d).add_(torch.ones(4, 3, device=d)),
    "copy_": lambda d: torch.zeros(4, 3, device=d).copy_(torch.ones(2, 3, device=d)),
    "index_put_": lambda d: torch.zeros(4, 3, device=d).index_put_((_index(d, 0, 1),), torch.ones(3, 3, device=d)),
    "put_": lambda d: torch.zeros(4, device=d).put_(_index(d, 0, 1, 2), torch.ones(2, device=d)),
}


@pytest.mark.parametrize("call", REFUSED_NOT_BROADCAST.values(), ids=REFUSED_NOT_BROADCAST.keys())
def test_shapes_pytorch_refuses_are_refused_not_broadcast(call):
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(type(on_cpu.value)) as on_device:
        call("tpu").cpu()
    message = str(on_device.value)  # PyTorch's own words, or ones naming the op or the shapes
    assert message.startswith(str(on_cpu.value)[:30]) or "aten." in message or "shape [" in message, message


def test_fused_mode_refuses_what_pytorch_refuses_where_it_records_the_op():
    """Fused mode infers each op's shapes when it records it: the same check runs there, so a
    refused call raises at the op (it computed `roll`'s and `trace`'s results before)."""
    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    tpu_backend.set_eager_mode("fused")
    try:
        with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
            torch.roll(x, (1, 2), (0,))
        with pytest.raises(RuntimeError, match="expected a matrix, but got tensor with dim 3"):
            torch.trace(torch.zeros(2, 2, 2, device="tpu"))
        assert (x * 2).sum().item() == 30.0
    finally:
        tpu_backend.set_eager_mode("strict")


def _arange(*shape, device):
    return torch.arange(float(math.prod(shape)), device=device).reshape(shape)


# Edge calls PyTorch accepts, next to the shape checks above: a 0-dim index counts as one
# element, slices clamp, a diagonal may be empty, a scatter's src may be larger than its index.
ACCEPTED_EDGES = {
    "gather (0-dim index)": lambda d: torch.gather(_arange(3, device=d), 0, _index(d, 1)[0]),
    "scatter (0-dim index and src)": lambda d: torch.zeros(3, device=d).scatter(0, _index(d, 1)[0], _index(d, 5.0)[0]),
    "scatter_reduce (0-dim index)": lambda d: torch.ones(3, device=d).scatter_reduce(
        0, _index(d, 2)[0], _index(d, 5.0)[0], "prod"
    ),
    "scatter (src larger than index)": lambda d: _arange(3, 4, device=d).scatter(
        1, torch.zeros(2, 2, dtype=torch.long, device=d), _arange(3, 3, device=d)
    ),
    "index_add_ (0-dim index)": lambda d: _arange(3, 2, device=d).index_add(
        0, _index(d, 1)[0], _arange(1, 2, device=d)
    ),
    "index_copy (0-dim x)": lambda d: _arange(device=d).index_copy(0, _index(d, 0), _index(d, 7.0)[0]),
    "slice_scatter (past the end)": lambda d: torch.slice_scatter(
        _arange(6, 2, device=d), _arange(2, 2, device=d), 0, 4, 100
    ),
    "slice_scatter (a step)": lambda d: torch.slice_scatter(
        _arange(6, 2, device=d), _arange(3, 2, device=d), 0, 0, None, 2
    ),
    "diagonal_scatter (empty)": lambda d: torch.diagonal_scatter(_arange(3, 4, device=d), _arange(0, device=d), 5),
    "as_strided_scatter (an offset)": lambda d: torch.as_strided_scatter(
        _arange(4, 4, device=d), _arange(2, 2, device=d), (2, 2), (4, 1), 5
    ),
    "put (0-dim index)": lambda d: _arange(2, 3, device=d).put(_index(d, 4)[0], _index(d, 9.0)[0]),
    "index_put (a broadcast row)": lambda d: _arange(4, 3, device=d).index_put(
        (_index(d, 0, 2),), _arange(3, device=d)
    ),
}


@pytest.mark.parametrize("call", ACCEPTED_EDGES.values(), ids=ACCEPTED_EDGES.keys())
def test_edge_calls_pytorch_accepts_compute_cpus_values(call):
    torch.testing.assert_close(call("tpu").cpu(), call("cpu"))


def test_bools_accumulate_as_pytorchs_or_and_and():
    """JAX's scatter-add and -multiply refuse bools; ATen adds them as integers read back as bools."""
    x, index, src = torch.tensor([False, True, False]), torch.tensor([0, 0, 2]), torch.tensor([True, False, False])
    cases = [
        lambda d: x.to(d).index_add(0, index.to(d), src.to(d)),
        lambda d: x.to(d).scatter_add(0, index.to(d), src.to(d)),
        lambda d: x.to(d).scatter_reduce(0, index.to(d), src.to(d), "prod"),
        lambda d: x.to(d).scatter_reduce(0, index.to(d), src.to(d), "amin", include_self=False),
        lambda d: x.to(d).index_put((index.to(d),), src.to(d), accumulate=True),
        lambda d: x.to(d).put(index.to(d), src.to(d), accumulate=True),
    ]
    for case in cases:
        assert torch.equal(case("tpu").cpu(), case("cpu"))


# OpInfo's error inputs (calls PyTorch's CPU kernels refuse) that the device still accepts,
# as (op, the error PyTorch's OpInfo expects): checks of values (a float passed traced, a
# distribution's entries, a complex fill of an integer tensor), of `out=` tensors (their dtype,
# their aliasing the input), and two meta kernels that accept what the CPU kernel refuses
# (negative convolution padding, histogramdd's bins). Exactly these: a new one fails the test,
# and a fixed one must leave the list.
ERROR_INPUTS_ACCEPTED = {
    ("amax", "Expected the dtype for input and out to match, but got Float for input's dtype and Int for out's dtype."),
    ("amin", "Expected the dtype for input and out to match, but got Float for input's dtype and Int for out's dtype."),
    ("aminmax", "Expected out tensor to have dtype float, but got double instead"),
    ("bernoulli", "unsupported operation"),
    ("cat", "the written-to tensor refer to a single memory location"),
    ("cat", "unsupported operation"),
    ("cauchy", "cauchy_ expects sigma > 0.0, but found sigma=0"),
    ("complex", "Expected object of scalar type ComplexDouble but got scalar type ComplexFloat for argument 'out'"),
    ("exponential", "exponential_ expects lambda > 0.0, but found lambda=0"),
    ("gather", "Expected out tensor to have dtype"),
    ("geometric", "geometric_ expects p to be in \\(0, 1\\), but got p=-1"),
    ("gather", "unsupported operation"),
    ("histogramdd", "histogramdd: The size of bins must be equal to the innermost dimension of the input."),
    ("index_select", "unsupported operation"),
    ("kthvalue", "unsupported operation"),
    ("log_normal", "log_normal_ expects std > 0.0, but found std=0"),
    ("masked_fill", "value cannot be converted to type .* without overflow"),
    ("masked_scatter", "masked_scatter_ only supports boolean masks"),
    ("masked_select", "unsupported operation"),
    ("multinomial", "invalid multinomial distribution"),
    ("multinomial", "multinomial expects Long tensor out"),
    ("multinomial", "probability tensor contains either `inf`, `nan` or element < 0"),
    ("nn.functional.conv3d", "negative padding is not supported"),
    ("nn.functional.huber_loss", "huber_loss does not support non-positive values for delta."),
    ("nn.functional.softshrink", "lambda must be in range \\[0,.*input dtype.*found -0\\.5"),
    ("normal", "normal expects std >= 0.0, but found std -1"),
    ("take", "unsupported operation"),
    ("uniform", "uniform_ expects to return a \\[from, to\\) range, but found from=3 > to=-1"),
}


def test_opinfo_error_inputs_are_refused_as_on_cpu():
    """Every OpInfo error input that PyTorch's CPU kernel refuses is refused on the device too
    (but `ERROR_INPUTS_ACCEPTED`): an op's program, traced for new shapes or static arguments,
    first asks PyTorch's kernels whether they accept the call. Before, 92 of 671 such calls
    computed a result, among them pooling with padding past half the kernel, `roll` with
    shifts and dims that do not pair, `trace` of a 3-d tensor and `embedding` of a 3-d weight."""
    from torch.testing._internal.common_methods_invocations import op_db

    accepted, refused = set(), 0
    warnings.simplefilter("ignore")  # (the error inputs call deprecated forms on purpose; pytest restores the filters)
    for op in op_db:
        if op.error_inputs_func is None:
            continue
        for error_input in op.error_inputs("cpu"):
            sample = error_input.sample_input
            try:
                op(sample.input, *sample.args, **sample.kwargs)
                continue  # (CPU accepts it too: an input for another device's checks)
            except Exception:  # noqa: BLE001 - any error PyTorch raises
                pass
            try:
                moved = opinfo_harness.move_sample(sample, "tpu")
                out = op(moved.input, *moved.args, **moved.kwargs)
                [t.cpu() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            except Exception:  # noqa: BLE001
                refused += 1
                continue
            accepted.add((op.name, str(error_input.error_regex)))
    assert refused > 500
    assert accepted == ERROR_INPUTS_ACCEPTED, (accepted - ERROR_INPUTS_ACCEPTED, ERROR_INPUTS_ACCEPTED - accepted)


def test_a_lowering_failing_on_a_call_torch_accepts_names_the_op(monkeypatch):
    """Not a user's mistake but a lowering's: a RuntimeError naming the op, never Python's
    'unsupported operand type(s)' (a TypeError from `a + b` turns into that)."""
    runner = runner_module.runner(torch.ops.aten.add.Tensor)

    def broken(*args, **kwargs):
        raise TypeError("a JAX complaint")

    monkeypatch.setattr(runner, "lowering", dataclasses.replace(runner.lowering, fn=broken))
    runner_module.clear_jit_cache()
    with pytest.raises(RuntimeError, match=r"tpu lowering of aten.add.Tensor failed: a JAX complaint"):
        ones("tpu", 3) + ones("tpu", 3)
    monkeypatch.undo()
    runner_module.clear_jit_cache()


# Products of two dtypes: ATen refuses them (no promotion); the device promoted them silently.
MIXED_PRODUCTS = {
    "matmul float32 @ int64": lambda d: ones(d, 2, 2) @ ones(d, 2, 2, dtype=torch.int64),
    "matmul 3-d float32 @ bfloat16": lambda d: ones(d, 2, 2, 2) @ ones(d, 2, 2, dtype=torch.bfloat16),
    "torch.bmm": lambda d: torch.bmm(ones(d, 1, 2, 2), ones(d, 1, 2, 2, dtype=torch.int64)),
    "torch.addmm": lambda d: torch.addmm(ones(d, 2), ones(d, 2, 2), ones(d, 2, 2, dtype=torch.int64)),
    "F.linear, float64 weight": lambda d: F.linear(ones(d, 2, 2), ones(d, 2, 2, dtype=torch.float64)),
    "F.linear, float64 bias": lambda d: F.linear(ones(d, 2, 2), ones(d, 2, 2), ones(d, 2, dtype=torch.float64)),
    "matrix @ vector": lambda d: ones(d, 2, 2) @ ones(d, 2, dtype=torch.int64),
    "torch.dot": lambda d: torch.dot(ones(d, 2), ones(d, 2, dtype=torch.int64)),
    "torch.baddbmm": lambda d: torch.baddbmm(
        ones(d, 1, 2, 2), ones(d, 1, 2, 2), ones(d, 1, 2, 2, dtype=torch.bfloat16)
    ),
}


@pytest.mark.parametrize("name", list(MIXED_PRODUCTS))
def test_a_product_of_two_dtypes_raises_as_on_cpu(mode, name):
    call = MIXED_PRODUCTS[name]
    with pytest.raises(RuntimeError):
        call("cpu")
    with pytest.raises(RuntimeError, match="dtype|scalar type") as got:
        call("tpu").cpu()
    assert any(n in str(got.value) for n in ("int64", "Long", "float64", "Double", "bfloat16", "BFloat16"))


def test_a_compiled_product_of_two_dtypes_raises_too():
    product = torch.compile(lambda a, b: a @ b, backend="tpu")
    with pytest.raises(
        RuntimeError,
        match="aten.mm: expected its operands to have the same dtype, but got: torch.float32 != torch.int64",
    ):
        product(ones("tpu", 2, 2), ones("tpu", 2, 2, dtype=torch.int64))
