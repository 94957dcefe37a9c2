"""`docs/torch_tpu_parity.md` stays true: it lists exactly torch-tpu 0.2.0's public names,
every name it claims for us imports, and the jobs it says `jax_op` or PyTorch's own API
do on "tpu" are done."""

from __future__ import annotations

import importlib
import os
import re

import jax
import pytest
import torch
import torch.nn.functional as F

import tpu_backend
import tpu_backend.kernel_ops  # noqa: F401  (torch.ops.tpu_kernels)

DOC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "torch_tpu_parity.md"
)

# torch-tpu 0.2.0, torch_tpu/_internal/public_api.py (_PUBLIC_MODULES), read from the wheel
# (pip download --no-deps torch-tpu==0.2.0): each module's exports and child modules.
TORCH_TPU_0_2_0 = {
    "torch.tpu": """EagerMode Event Precision Stream allow_excess_precision current_device current_stream
        default_generators default_stream device device_count device_of eager_mode get_amp_supported_dtype
        get_device_name get_device_properties get_rng_state initial_seed is_available is_initialized
        manual_seed manual_seed_all precision set_device set_eager_mode set_rng_state set_stream stream
        synchronize topology_aware_mesh compiler distributed ops optimizers pallas profiler""",
    "torch.tpu.compiler": "custom_compiler_options",
    "torch.tpu.distributed": """set_tpu_launch_env spmd_safe topology_aware_mesh window_num_stripes
        window_stripe_chunk_mb""",
    "torch.tpu.ops": """align_jagged_to_multiple all_gather_dim max_pool1d max_pool1d_backward max_pool2d
        max_pool2d_backward max_pool3d max_pool3d_backward optimization_barrier ragged_all_to_all ragged_dot
        ragged_dot_weight_grad recv reduce_scatter_dim send sparse_dense_matmul
        sparse_dense_matmul_activation_unstack sparse_dense_matmul_grad_with_adagrad
        sparse_dense_matmul_grad_with_adam sparse_dense_matmul_grad_with_sgd
        sparse_dense_matmul_gradient_stack sparse_gather sparse_gather_backward sparse_iota sparse_map_row
        splash_sdpa strip_jagged_padding""",
    "torch.tpu.optimizers": "AdamW Muon Optimizer Sgd SingleTraceTrainer",
    "torch.tpu.pallas": "get_pallas_mesh jax_op",
    "torch.tpu.profiler": "TpuProfilerConfig",
}
STATUSES = ("same name", "equivalent", "not provided")


def doc_rows() -> dict[str, tuple[str, list[str]]]:
    """{torch-tpu name: (status, our names)} from the table rows `| name | status | ours | notes |`."""
    rows = {}
    with open(DOC) as f:
        for line in f:
            cells = [cell.strip() for cell in line.strip().split("|")[1:-1]]
            if len(cells) != 4 or not cells[0].startswith("`torch.tpu"):
                continue
            name, status, ours = cells[0].strip("`"), cells[1], cells[2]
            assert name not in rows, f"{name} listed twice"
            rows[name] = (status, re.findall(r"`([\w.]+)`", ours))
    return rows


def resolve(path: str):
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(path)


def test_the_table_lists_exactly_torch_tpus_public_names():
    expected = {f"{module}.{name}" for module, names in TORCH_TPU_0_2_0.items() for name in names.split()}
    listed = set(doc_rows())
    assert listed - expected == set(), "listed but not torch-tpu 0.2.0 names"
    assert expected - listed == set(), "torch-tpu 0.2.0 names missing from the table"


def test_every_row_has_a_status_and_claims_only_names_that_exist():
    for name, (status, ours) in doc_rows().items():
        assert status in STATUSES, f"{name}: status {status!r}"
        if status == "not provided":
            assert ours == [], f"{name}: not provided, yet names {ours}"
            continue
        assert ours, f"{name}: {status} but names nothing of ours"
        if status == "same name":
            assert name in ours, f"{name}: 'same name' must list {name} itself"
        for path in ours:
            assert resolve(path) is not None, path


def test_same_names_are_our_objects():
    assert resolve("torch.tpu.pallas.jax_op") is torch.tpu.jax_op is tpu_backend.jax_op
    assert torch.tpu.set_eager_mode is resolve("torch.tpu.set_eager_mode")
    assert isinstance(torch.tpu.eager_mode, torch.tpu.EagerMode)


def test_eager_mode_property_switches_modes():
    torch.tpu.eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE
    try:
        assert tpu_backend.get_eager_mode() == "fused"
        assert (torch.ones(2, device="tpu") * 3).sum().item() == 6.0
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    assert torch.tpu.eager_mode == torch.tpu.EagerMode.DEFER_NEVER and tpu_backend.get_eager_mode() == "strict"


def test_device_properties_and_device_of():
    properties = torch.tpu.get_device_properties(0)
    assert properties.total_memory > 0 and properties.name == torch.tpu.get_device_name()
    with torch.tpu.device_of(torch.ones(1, device="tpu")):
        assert torch.tpu.current_device() == 0


# --------------------------------------------------------------------------- "equivalent" jobs


@torch.tpu.jax_op("parity::ragged_dot")
def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)


@torch.tpu.jax_op("parity::optimization_barrier")
def optimization_barrier(x: jax.Array) -> jax.Array:
    return jax.lax.optimization_barrier(x)


@pytest.mark.slow
def test_ragged_dot_as_a_jax_op_matches_a_per_group_matmul():
    torch.manual_seed(0)
    lhs = torch.randn(7, 4, requires_grad=True)
    rhs = torch.randn(3, 4, 5, requires_grad=True)  # one (4, 5) weight per group
    sizes = torch.tensor([2, 0, 5], dtype=torch.int32)
    lhs_tpu, rhs_tpu = (t.detach().to("tpu").requires_grad_() for t in (lhs, rhs))
    out = ragged_dot(lhs_tpu, rhs_tpu, sizes.to("tpu"))
    groups = torch.repeat_interleave(torch.arange(3), sizes.long())
    expected = torch.einsum("nk,nkm->nm", lhs, rhs[groups])
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(out.cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lhs_tpu.grad.cpu(), lhs.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rhs_tpu.grad.cpu(), rhs.grad, rtol=1e-5, atol=1e-5)  # ragged_dot_weight_grad


def test_optimization_barrier_as_a_jax_op_is_the_identity():
    x = torch.randn(4, device="tpu", requires_grad=True)
    optimization_barrier(x * 2).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((4,), 2.0))


@pytest.mark.slow
@pytest.mark.parametrize("pool, shape", [(F.max_pool1d, (2, 3, 10)), (F.max_pool3d, (1, 2, 6, 6, 6))])
def test_max_pools_and_their_backward_run_on_the_device(pool, shape):
    x = torch.randn(*shape, requires_grad=True)
    x_tpu = x.detach().to("tpu").requires_grad_()
    pool(x, 2).sum().backward()
    pool(x_tpu, 2).sum().backward()
    torch.testing.assert_close(x_tpu.grad.cpu(), x.grad)


@pytest.mark.slow
def test_pytorchs_muon_steps_on_the_device():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 6, bias=False).to("tpu")
    before = layer.weight.detach().cpu()
    optimizer = torch.optim.Muon(layer.parameters(), lr=0.02)
    layer(torch.randn(4, 8).to("tpu")).square().sum().backward()
    optimizer.step()
    moved = (layer.weight.detach().cpu() - before).abs()
    assert torch.isfinite(moved).all() and moved.max() > 1e-3
