"""The compiled dispatch path (`tpu_backend/native`) against the pure-Python one.

The extension must change nothing but speed: `flatten_args` in C++ gives what the Python
definition gives, its views share their storage's payload as the Meta views do, and the
device's core parity tests pass on the other path too (run in a child process, since the
path is chosen once, at import).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import tpu_backend
from tests import chip
from tests.chip import child_env
from tpu_backend import native
from tpu_backend.eager import arguments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
compiled = pytest.mark.skipif(native.module is None, reason=f"dispatch path: {native.status()}")

# The other path runs these (views and in-place writes, the kernels, errors as PyTorch's, a
# strict and a fused training run against CPU): about a minute.
CORE_PARITY_TESTS = [
    "tests/tpu_backend/test_views_inplace.py",
    "tests/tpu_backend/test_dispatch.py",
    "tests/tpu_backend/test_errors_like_torch.py",
    "tests/tpu_backend/test_training_parity.py::test_losses_match_cpu_every_step[transformer-adamw-strict]",
    "tests/tpu_backend/test_fused.py::test_views_and_inplace_match_cpu",
    "tests/tpu_backend/test_fused.py::test_training_matches_cpu_with_one_program_per_step[transformer-adamw]",
]


def _run(env_overrides: dict, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = child_env(**env_overrides)  # off the chip (one process holds it)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # the default suite's time budget: run with -m slow
def test_core_parity_on_the_other_dispatch_path():
    """This process runs one path (native when built); the core parity tests run on the other."""
    other = "0" if native.module is not None else "1"
    if other == "1" and not os.path.exists(native.library_path()):
        pytest.skip("the native extension is not built (tools/setup.sh builds it)")
    done = _run({"TPU_NATIVE": other}, "-m", "pytest", "-q", "-p", "no:randomly", *CORE_PARITY_TESTS)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    check = _run({"TPU_NATIVE": other}, "-c", "import tpu_backend.native as n, tpu_backend; print(n.status())")
    assert check.stdout.strip().startswith("native" if other == "1" else "python (TPU_NATIVE=0)"), check


def test_missing_extension_falls_back_and_says_so_once(tmp_path):
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import torch, tpu_backend\n"
        "    from tpu_backend import native\n"
        "    native.load(); native.load()\n"
        "    x = torch.arange(6.0).to('tpu').view(2, 3).t()\n"
        "    print(x.sum().item(), native.status())\n"
        "print(sum('compiled dispatch path is off' in str(w.message) for w in seen))\n"
    )
    done = _run({"TPU_NATIVE": "1", "TPU_NATIVE_BUILD_DIR": str(tmp_path)}, "-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    first, count = done.stdout.strip().splitlines()[-2:]
    assert first.startswith("15.0 python (not built")
    assert count == "1"


@compiled
def test_storage_key_is_the_payload_tables_key():
    x = torch.ones(4, device="tpu")
    assert native.module.storage_key(x) == x.untyped_storage()._cdata
    assert native.module.storage_key(x[1:]) == native.module.storage_key(x)


def _argument_cases():
    a = torch.arange(12.0).reshape(3, 4).to("tpu")
    b = torch.ones(3, 4, device="tpu")
    cases = [
        ((a, b), {}),
        ((a, 2.5), {"alpha": 3}),
        ((a.t(), a[1:], a[:, 1], a.expand(2, 3, 4)), {}),  # views: geometry in the template
        (([a, b], [b, a], 0.5), {}),  # foreach lists
        ((a, None, True, torch.float32, "mean"), {"dim": (0, 1), "keepdim": False}),
        ((a, torch.tensor(2.0)), {}),  # a CPU scalar tensor mixes in
        ((a.view(torch.int32),), {}),  # a re-typed storage: the Python slow path
        ((a, torch.Size([4, 3])), {}),
        ((a.conj(), a.neg()), {}),
    ]
    return cases


@compiled
@pytest.mark.parametrize("dynamic_floats", [True, False])
@pytest.mark.parametrize("defer_views", [True, False])
def test_flatten_args_in_cpp_agrees_with_python(dynamic_floats, defer_views):
    # Each side gets its own tensors: reading a re-typed storage re-types its payload.
    for (args, kwargs), (same_args, same_kwargs) in zip(_argument_cases(), _argument_cases()):
        got = native.module.flatten_args(args, kwargs, dynamic_floats, defer_views=defer_views)
        want = arguments.python_flatten_args(same_args, same_kwargs, dynamic_floats, defer_views)
        assert got[1:] == want[1:], (args, kwargs)
        assert len(got[0]) == len(want[0])
        for mine, theirs in zip(got[0], want[0]):
            assert type(mine) is type(theirs) and bool(jnp.all(jnp.asarray(mine) == jnp.asarray(theirs))), (
                args,
                kwargs,
            )


@compiled
def test_flatten_args_errors_are_pythons():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        native.module.flatten_args((torch.ones(2, device="tpu"), torch.ones(2)), {})


@compiled
def test_cpp_views_share_the_payload_and_writes_reach_the_base():
    base = torch.zeros(4, 6, device="tpu")
    views = [base.view(24), base.t(), base.as_strided((2, 3), (6, 2), 1), base.unfold(1, 2, 2), base.reshape(6, 4)]
    for view in views:
        assert view.untyped_storage()._cdata == base.untyped_storage()._cdata
    base.t()[1].fill_(1.0)  # a write through a view of a view
    expected = torch.zeros(4, 6)
    expected.t()[1].fill_(1.0)
    assert torch.equal(base.cpu(), expected)
    assert torch.equal(base.unfold(1, 2, 2).cpu(), expected.unfold(1, 2, 2))


@compiled
def test_cpp_views_check_their_arguments():
    x = torch.zeros(4, device="tpu")
    with pytest.raises(RuntimeError, match="Negative strides"):
        x.as_strided((2,), (-1,))
    with pytest.raises(RuntimeError, match="mismatch in length"):
        x.as_strided((2, 2), (1,))
    with pytest.raises(RuntimeError, match="invalid"):
        x.view(3)


def test_one_device_guard():
    """The guard (C++ or Python) reports one device and one in-order stream."""
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0
    stream = torch.Stream(device="tpu")
    assert (stream.device_index, stream.stream_id, stream.query()) == (0, 0, True)
    event = torch.Event(device="tpu")
    event.record(stream)
    assert event.query()
    x = torch.ones(3, device="tpu", requires_grad=True)
    (x * 2).sum().backward()  # autograd's device thread asks the guard for the device
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))
    assert tpu_backend.native.status() in ("native", f"python ({native.reason})")


@compiled
def test_an_installer_that_fails_keeps_the_python_version():
    with pytest.warns(RuntimeWarning, match="compiled thing could not be installed"):
        assert native.install("thing", "no_such_installer") is None


def _native_calls() -> int:
    return native.module.call_counts()[0]


@compiled
def test_known_calls_run_in_cpp_like_python():
    """An op call the Python kernel has run is run by the C++ kernel: the same values, and
    result tensors just like the Python kernel's (device, dispatch keys, payload)."""
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    ta, tb = a.to("tpu"), b.to("tpu")
    python_made = [torch.mul(ta, tb) for _ in range(2)][0]  # the Python kernel runs it, then teaches C++
    before = _native_calls()
    cpp_made = torch.mul(ta, tb)
    assert _native_calls() == before + 1
    assert torch.equal(cpp_made.cpu(), a * b) and torch.equal(python_made.cpu(), a * b)
    assert cpp_made.device == python_made.device == torch.device("tpu:0")
    assert torch._C._dispatch_keys(cpp_made) == torch._C._dispatch_keys(python_made)
    assert cpp_made.untyped_storage().device == torch.device("tpu:0")
    count = tpu_backend.tensor.payload_count()
    del cpp_made
    assert tpu_backend.tensor.payload_count() == count - 1  # its payload goes with it
    values, indices = torch.sort(ta, dim=1)  # several results
    values, indices = torch.sort(ta, dim=1)
    before = _native_calls()
    values, indices = torch.sort(ta, dim=1)
    assert _native_calls() == before + 1
    expected = torch.sort(a, dim=1)
    assert torch.equal(values.cpu(), expected.values) and torch.equal(indices.cpu(), expected.indices)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_results_release_their_payload_when_their_last_tensor_dies(mode):
    """Op results (made in C++ on the compiled path) give their payload back when their
    storage dies, on autograd's backward thread too; a tensor moved onto another storage
    (`set_`) or resized keeps its data, and the storage it left is released."""
    previous = _in_modes(mode)
    try:
        a, b = torch.randn(8, 8), torch.randn(8, 8)
        ta, tb = a.to("tpu"), b.to("tpu")
        weight = torch.randn(8, 8).to("tpu").requires_grad_()
        backward_threads = []

        def train_step():
            product = weight * ta
            product.register_hook(lambda grad: backward_threads.append(threading.get_ident()))
            (product + tb).sum().backward()

        for _ in range(3):  # known calls from here on
            torch.mul(ta, tb)
            train_step()
            weight.grad = None
        start = tpu_backend.payload_count()
        results = [torch.mul(ta, tb) for _ in range(5)]
        if native.module is not None:  # made by the C++ kernel: the storage, not a weakref, holds the payload
            assert all(tpu_backend.tensor.payload_of(r).ref is None for r in results)
        assert tpu_backend.payload_count() == start + 5
        del results
        assert tpu_backend.payload_count() == start
        backward_threads.clear()
        train_step()
        assert backward_threads and backward_threads[0] != threading.get_ident()  # intermediates die there
        assert tpu_backend.payload_count() == start + 1  # weight.grad
        weight.grad = None
        assert tpu_backend.payload_count() == start

        moved, kept = torch.mul(ta, tb), torch.add(ta, tb)
        moved.set_(kept)
        del kept
        assert tpu_backend.payload_count() == start + 1  # the storage `moved` left is released
        assert torch.equal(moved.cpu(), a + b)
        grown = torch.mul(ta, tb)
        grown.resize_(80)
        assert torch.equal(grown[:64].cpu(), (a * b).flatten()) and torch.equal(grown[64:].cpu(), torch.zeros(16))
        source = torch.sub(ta, tb)
        rebuilt = torch.empty(0, device="tpu").set_(source.untyped_storage(), 0, (8, 8), (8, 1))
        del source
        assert torch.equal(rebuilt.cpu(), a - b)
        del moved, grown, rebuilt
        assert tpu_backend.payload_count() == start
    finally:
        tpu_backend.set_eager_mode(previous)


@compiled
def test_views_never_take_a_known_calls_program():
    """A call is known by its static arguments; an input that is a view (read through a
    gather in the Python kernel's program) keeps it on the Python path, whichever came first."""
    base = torch.arange(16.0)
    plain = base.reshape(4, 4).to("tpu")
    reshaped = base.to("tpu").view(4, 4)  # covers its storage, in another shape than the payload's
    transposed = plain.t()
    for _ in range(3):
        for x, expected in (
            (reshaped, base.reshape(4, 4)),
            (plain, base.reshape(4, 4)),
            (transposed, base.reshape(4, 4).t()),
        ):
            rtol = chip.tolerance("transcendentals", cpu=1.3e-6, tpu=1e-5)  # exp: 5e-6 seen on a v5e
            torch.testing.assert_close(torch.exp(x).cpu(), torch.exp(expected), rtol=rtol, atol=1e-5)


@compiled
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_python_numbers_and_cpu_scalars_in_known_calls(mode):
    """`x * 3` passes 3 as a wrapped-number tensor, which the Python kernel sees as the
    number (an int is static, a float dynamic); a 0-d CPU tensor is a dynamic value. Known
    calls must tell 3 from -1 and reuse a float's program for another float."""
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode(mode)
    try:
        x = torch.tensor([1.0, -2.0, 3.0, -4.0])
        tx = x.to("tpu")
        for _ in range(3):
            for factor in (3, -1, 2.5, -0.5, True, torch.tensor(4.0), torch.tensor(-2.0)):
                torch.testing.assert_close((tx * factor).cpu(), x * factor)
    finally:
        tpu_backend.set_eager_mode(previous)


@compiled
def test_fused_record_in_cpp_records_like_python():
    """`fused.record` is the C++ one; it records the same nodes, wiring, external inputs,
    floats and placeholders as the Python definition, and graphs from either run alike."""
    from tpu_backend import fused

    assert fused.record is native.module.fused_record
    a, b = jnp.arange(6.0).reshape(2, 3), jnp.ones((2, 3))
    split = lambda x, y, f: (x * f, y)  # noqa: E731 - one function object for both records
    nested = lambda x: {"t": [x, x + 1]}  # noqa: E731
    total = lambda x, y: (x + y).sum()  # noqa: E731

    def graph(record):
        s = record(("add",), jnp.add, [a, b])
        pair = record(("split",), split, [s, a, 0.5])  # a flat tuple
        tree = record(("nested",), nested, [pair[0]])  # any pytree
        out = record(("sum",), total, [tree["t"][1], b])
        state = fused._graph
        recorded = [node for node in state.nodes], list(state.external), list(state.floats), state.state
        shapes = [(p.shape, p.dtype, p.weak_type, p.ref) for p in state.placeholders]
        fused.sync()
        return recorded, shapes, type(pair), out.force()

    (nodes, external, floats, state), shapes, kind, value = graph(fused.python_record)
    (cpp_nodes, cpp_external, cpp_floats, cpp_state), cpp_shapes, cpp_kind, cpp_value = graph(fused.record)
    assert cpp_nodes == nodes and cpp_floats == floats == [0.5] and cpp_state is state
    assert [x is y for x, y in zip(cpp_external, external)] == [True, True]
    assert cpp_shapes == shapes and cpp_kind is kind is tuple
    assert float(cpp_value) == float(value) == float(((jnp.arange(6.0).reshape(2, 3) + 1) * 0.5 + 1 + 1).sum())


def _in_modes(mode):
    previous = tpu_backend.get_eager_mode()
    tpu_backend.set_eager_mode(mode)
    return previous


@compiled
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_inplace_known_calls_run_in_cpp_like_python(mode):
    """`add_` and friends: once the Python in-place kernel has run a call (its functional op's
    runner learns it), the C++ kernel runs the lowering and writes the result into `self`:
    the same values, `self` returned, its version counter bumped, views and their base
    sharing the write, another dtype cast (or refused) as ATen does."""
    previous = _in_modes(mode)
    try:
        x, y = torch.randn(4, 4), torch.randn(4, 4)
        tx, ty = x.to("tpu"), y.to("tpu")
        for step in range(3):
            before = _native_calls()
            version = tx._version
            assert tx.add_(ty, alpha=0.5) is tx
            x.add_(y, alpha=0.5)
            assert tx._version == version + 1
            if mode == "strict" and step == 2:
                assert _native_calls() == before + 1  # run in C++
            torch.testing.assert_close(tx.cpu(), x)
            tx.mul_(2).sub_(ty)  # a wrapped number, then a default alpha
            x.mul_(2).sub_(y)
            torch.testing.assert_close(tx.cpu(), x)
        row, column = tx[1], tx[:, 2]  # views as self (scattered back) and as input
        for _ in range(3):
            row.mul_(0.5)
            x[1].mul_(0.5)
            column.add_(ty[0])
            x[:, 2].add_(y[0])
            torch.testing.assert_close(tx.cpu(), x)
        half = torch.ones(3, dtype=torch.bfloat16)
        thalf = half.to("tpu")
        for _ in range(3):  # float32 result cast into a bfloat16 self
            thalf.add_(torch.full((3,), 0.25, device="tpu"))
            half.add_(torch.full((3,), 0.25))
            assert thalf.dtype == torch.bfloat16
            torch.testing.assert_close(thalf.cpu(), half)
        counts = torch.arange(3).to("tpu")
        for _ in range(2):
            with pytest.raises(RuntimeError, match="can't be cast"):
                counts.mul_(torch.full((3,), 0.5, device="tpu"))
        assert torch.equal(counts.cpu(), torch.arange(3))
    finally:
        tpu_backend.set_eager_mode(previous)


@compiled
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_foreach_known_calls_run_in_cpp_like_python(mode):
    """The `_foreach_*` kernels (AdamW's step): in-place ones write every list element in
    C++, functional ones return a Tensor[] made there; Scalar lists and CPU scalar tensors
    are dynamic values (no new program when they change); new shapes miss and learn."""
    previous = _in_modes(mode)
    try:
        shapes = [(4, 4), (3,), (2, 5)]
        cpu = [torch.randn(shape) for shape in shapes]
        other = [torch.rand(shape) + 0.5 for shape in shapes]
        tpu, tother = [t.to("tpu") for t in cpu], [t.to("tpu") for t in other]
        rows = [t[0] for t in tpu[:1]]  # a view in the list
        for step in range(4):
            before = _native_calls()
            torch._foreach_mul_(tpu, 0.9)
            torch._foreach_lerp_(tpu, tother, 0.1)
            torch._foreach_addcdiv_(tpu, tother, tother, [0.1 * step, -0.2, 0.3])
            torch._foreach_add_(tpu, torch.tensor(1.5))
            torch._foreach_mul_(rows, 2.0)
            roots = torch._foreach_sqrt(tother)
            for t, o in zip(cpu, other):
                t.mul_(0.9).lerp_(o, 0.1)
            torch._foreach_addcdiv_(cpu, other, other, [0.1 * step, -0.2, 0.3])
            torch._foreach_add_(cpu, torch.tensor(1.5))
            cpu[0][0].mul_(2.0)
            if mode == "strict" and step >= 2:
                assert _native_calls() == before + 6  # every call in C++
            for t, c in zip(tpu, cpu):
                torch.testing.assert_close(t.cpu(), c)
            assert type(roots) is type(torch._foreach_sqrt(other)) and len(roots) == 3
            for r, o in zip(roots, other):
                torch.testing.assert_close(r.cpu(), o.sqrt())
        more = [torch.ones(7, device="tpu")]  # another shape: a miss, then known
        for _ in range(3):
            torch._foreach_mul_(more, 3.0)
        assert torch.equal(more[0].cpu(), torch.full((7,), 27.0))
    finally:
        tpu_backend.set_eager_mode(previous)


@compiled
def test_inplace_known_calls_donate_self_in_cpp():
    """Strict in-place calls run in C++ donate self's buffers (XLA writes the result into
    them: the payload's buffer stays the same) unless something else holds the array."""
    from tpu_backend import tensor as device_tensor

    def buffer(t):
        return device_tensor.payload_of(t).array.unsafe_buffer_pointer()

    previous = _in_modes("strict")
    try:
        x, xs = torch.ones(64).to("tpu"), [torch.ones(8).to("tpu"), torch.ones(3, 3).to("tpu")]
        for step in range(4):
            before, kept = _native_calls(), [buffer(x)] + [buffer(t) for t in xs]
            x.mul_(2.0)
            torch._foreach_add_(xs, 1.0)
            if step >= 2:
                assert _native_calls() == before + 2  # run in C++
                assert [buffer(x)] + [buffer(t) for t in xs] == kept  # written in place
        assert torch.equal(x.cpu(), torch.full((64,), 16.0))
        assert torch.equal(xs[1].cpu(), torch.full((3, 3), 5.0))
        held = torch.tpu.to_jax(x)
        before = _native_calls()
        x.mul_(2.0)
        assert _native_calls() == before + 1 and not held.is_deleted()
        assert torch.equal(torch.from_numpy(np.array(held)), torch.full((64,), 16.0))
        assert torch.equal(x.cpu(), torch.full((64,), 32.0))
    finally:
        tpu_backend.set_eager_mode(previous)


@compiled
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_copy_between_tpu_tensors_in_cpp_like_python(mode):
    """`copy_` from a whole tpu tensor runs in C++ (the source's array written into the
    destination); casting, broadcasting, views and host copies keep core_ops.copy_."""
    kernels = [line for line in torch._C._dispatch_dump("aten::copy_").splitlines() if line.startswith("PrivateUse1:")]
    assert "_tpu_native.cpp" in kernels[0]
    previous = _in_modes(mode)
    try:
        src = torch.randn(4, 4)
        tsrc = src.to("tpu")
        dst = torch.zeros(4, 4, device="tpu")
        version = dst._version
        assert dst.copy_(tsrc) is dst and dst._version == version + 1
        assert torch.equal(dst.cpu(), src)
        tsrc.mul_(2)  # the copy is not an alias of the source
        assert torch.equal(dst.cpu(), src)
        halves = torch.zeros(4, 4, dtype=torch.bfloat16, device="tpu")
        halves.copy_(tsrc)  # cast
        assert torch.equal(halves.cpu(), (src * 2).to(torch.bfloat16))
        dst[1].copy_(tsrc[2])  # views: destination scattered, source gathered
        dst[:, 0].copy_(torch.arange(4.0, device="tpu"))  # a whole source into a view
        wide = torch.zeros(3, 4, device="tpu")
        wide.copy_(torch.arange(4.0, device="tpu"))  # broadcast
        expected = src.clone()
        expected[1] = src[2] * 2
        expected[:, 0] = torch.arange(4.0)
        assert torch.equal(dst.cpu(), expected)
        assert torch.equal(wide.cpu(), torch.arange(4.0).expand(3, 4))
        host = torch.empty(4, 4)
        host.copy_(dst)  # device -> host
        assert torch.equal(host, expected)
    finally:
        tpu_backend.set_eager_mode(previous)


@compiled
def test_live_outputs_and_donations_in_cpp_agree_with_python():
    """fused mode's reference-count loops at a sync point give in C++ what their Python
    definitions give: placeholders held outside the graph's list are live; inputs held only
    by the list that are JAX arrays are donated, as many per kind as outputs can reuse."""
    import numpy as np

    from tpu_backend import fused

    aval = ((3,), np.dtype("float32"), False)
    held = fused.LazyArray(aval, ("n", 0, 1))
    placeholders = [fused.LazyArray(aval, ("n", 0, 0)), held, fused.LazyArray(aval, ("n", 1, 0))]
    assert fused._live_outputs is native.module.live_outputs
    assert fused._live_outputs(placeholders) == fused.python_live_outputs(placeholders) == (1,)

    kept = jnp.ones(3)  # still readable: never donated
    external = [jnp.zeros(3), kept, jnp.zeros(3), np.zeros(3), jnp.zeros(2), jnp.zeros(3), jnp.zeros(2)]
    kinds, reusable = [0, 0, 0, 0, 1, 0, 2], [2, 1, 0]
    assert fused._donated(external, kinds, reusable) == fused.python_donated(external, kinds, reusable) == (0, 2, 4)
    assert reusable == [2, 1, 0]


@compiled
def test_a_recorded_steps_live_outputs_and_donations_in_cpp_agree_with_python():
    """On a recorded training step (not yet run): the same live placeholders and the same
    donated inputs (the parameters' old values) from the C++ loops and the Python ones."""
    from tpu_backend import fused

    previous = _in_modes("fused")
    try:
        model = torch.nn.Linear(4, 3).to("tpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        inputs = torch.randn(2, 4).to("tpu")

        def step():
            optimizer.zero_grad()
            model(inputs).sum().backward()
            optimizer.step()

        step()
        tpu_backend.mark_step()
        step()
        graph = fused._graph
        live = fused._live_outputs(graph.placeholders)
        assert live == fused.python_live_outputs(graph.placeholders)
        assert 0 < len(live) < len(graph.placeholders)
        ending = fused._Ending(graph, live)
        donated = fused._donated(graph.external, ending.external_kinds, ending.reusable)
        assert donated == fused.python_donated(graph.external, ending.external_kinds, ending.reusable)
        assert len(donated) == 2  # weight and bias
        tpu_backend.mark_step()
    finally:
        tpu_backend.set_eager_mode(previous)


@compiled
def test_replace_computed_payloads_in_cpp_agrees_with_python(monkeypatch):
    """After a sync point: a computed placeholder's value replaces it, any other LazyValue
    is forced, and concrete or unmaterialised payloads are left alone, in C++ as in Python."""
    import numpy as np

    from tpu_backend import fused
    from tpu_backend import tensor as tpu_tensor

    class Pending(tpu_tensor.LazyValue):  # a LazyValue that is not a placeholder
        def force(self):
            return jnp.full(3, 7.0)

    computed = fused.LazyArray(((3,), np.dtype("float32"), False), ("n", 0, 0))
    computed.value = jnp.arange(3.0)
    kept = jnp.ones(3)
    arrays = [computed, Pending(), kept, None]

    def table():
        return {i: tpu_tensor.StoragePayload(3, torch.float32, array) for i, array in enumerate(arrays)}

    cpp = table()
    native.module.replace_computed_payloads(cpp, tpu_tensor.LazyValue)
    python = table()
    monkeypatch.setattr(tpu_tensor, "_PAYLOADS", python)
    tpu_tensor.python_replace_computed_payloads()
    for payloads in (cpp, python):
        assert payloads[0].array is computed.value and payloads[2].array is kept and payloads[3].array is None
        assert payloads[1].array.tolist() == [7.0] * 3


@compiled
def test_program_argument_split_in_cpp_agrees_with_python():
    """A program call's arguments: JAX arrays (with their weak types) and numpy arrays are
    passed, everything else is static, in C++ as in Python."""
    import jax
    import numpy as np

    from tpu_backend.compile import program

    args = (jnp.ones(2), jnp.asarray(2.0), np.zeros(3), 3, None, jax.random.key(0), "name")
    assert program._split(args) == program.python_split(args)
    assert program._split(args)[1] == (False, True, False, False)


@compiled
def test_compiled_graph_input_read_in_cpp_agrees_with_python():
    """A compiled graph's inputs: a tpu tensor that is its whole storage gives the storage's
    array itself and its payload; views, math bits, CPU tensors, numbers and inputs without
    a fast slot go the general way (`tensor_to_jax`), in C++ as in Python."""
    from tpu_backend import tensor as device_tensor
    from tpu_backend.compile import compiled_graph

    whole = torch.arange(6.0).reshape(2, 3).to("tpu")
    other = torch.ones(4, dtype=torch.bfloat16).to("tpu")
    complex_ = torch.tensor([1 + 2j, 3 - 1j]).to("tpu")
    args = [whole, whole[:, 1], other, complex_.conj(), torch.ones(3), 7, whole.t(), other]
    slots = [compiled_graph._Slot(a) if isinstance(a, torch.Tensor) else None for a in args]
    slots[-1] = None  # an input the graph gave no fast slot
    got, want = compiled_graph._read_inputs(list(args), slots), compiled_graph.python_read_inputs(list(args), slots)
    assert compiled_graph._read_inputs is not compiled_graph.python_read_inputs
    for value, expected in zip(got[0], want[0]):
        assert type(value) is type(expected)
        np.testing.assert_array_equal(np.asarray(value), np.asarray(expected))
    assert got[0][0] is device_tensor.payload_of(whole).array and got[0][2] is device_tensor.payload_of(other).array
    assert [p is not None for p in got[1]] == [p is not None for p in want[1]] == [True, False, True] + [False] * 5
    assert got[1][0] is want[1][0] is device_tensor.payload_of(whole)
    with pytest.raises(TypeError, match="whole_arrays"):
        native.module.whole_arrays([whole], [], compiled_graph._input_to_jax)
