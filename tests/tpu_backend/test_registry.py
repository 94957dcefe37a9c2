"""The one lowering table: a record per op, registered once, connected on registration."""

import jax.numpy as jnp
import pytest
import torch

import tpu_backend  # noqa: F401
from tpu_backend.ops.registry import JAX_LOWERINGS, LOWERINGS, VIEW_LOWERINGS, lowers

_LIB = torch.library.Library("tpu_registry_test", "DEF")
_LIB.define("twice(Tensor x) -> Tensor")
_LIB.impl("twice", lambda x: x * 2, "CPU")
_LIB.define("composite(Tensor x) -> Tensor")
_LIB.impl("composite", lambda x: x + 1, "CompositeImplicitAutograd")


def test_a_lowering_added_after_import_runs_without_re_registration():
    op = torch.ops.tpu_registry_test.twice.default

    @lowers(op)
    def twice(x):
        return x * 2

    x = torch.arange(3.0)
    assert torch.equal(torch.ops.tpu_registry_test.twice(x.to("tpu")).cpu(), x * 2)
    assert LOWERINGS[op].kind == "op" and op in JAX_LOWERINGS and op not in VIEW_LOWERINGS


def test_a_composite_implicit_lowering_is_refused_in_eager_with_a_warning():
    op = torch.ops.tpu_registry_test.composite.default
    with pytest.warns(UserWarning, match="CompositeImplicitAutograd.*torch.compile and fused graphs only"):
        lowers(op)(lambda x: x + 100)
    x = torch.zeros(2)
    assert torch.equal(torch.ops.tpu_registry_test.composite(x.to("tpu")).cpu(), x + 1)  # the decomposition ran


def test_a_target_is_lowered_once_across_kinds():
    with pytest.raises(ValueError, match="lowered twice"):
        lowers(torch.ops.aten.add.Tensor, kind="graph")(lambda a, b: jnp.add(a, b))
    view_op = next(iter(VIEW_LOWERINGS))
    with pytest.raises(ValueError, match="lowered twice"):
        lowers(view_op)(lambda x: x)
