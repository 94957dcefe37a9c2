"""The Dynamo backend "tpu": `torch.compile(model, backend="tpu")`.

Dynamo captures a Python-level FX graph; AOTAutograd (`aot_autograd` below) turns it
into functional ATen forward and backward graphs, decomposed with PyTorch's
decompositions *except* where our lowering table has the op itself (a direct lowering
is shorter and usually faster than its decomposition). Each graph becomes a `Program`
(`interpreter.compile_graph`): the graph interpreted through the shared lowering table
inside one `jax.jit`, compiled once per input signature and cached on disk.

At run time the compiled callable (`compiled_graph.py`) takes the JAX payloads of its tensor inputs (tpu
tensors: their device arrays; CPU tensors: copies, so the backend also works and is
tested without the device), runs the program, and wraps the outputs as tensors on the
device each output's metadata names. Graph breaks need nothing here: Dynamo runs the
code between graphs eagerly, on the tpu device's eager kernels.

Inputs a graph writes (an optimizer step's parameters and state, batch norm's running
statistics) are written by the compiled callable itself, with their old buffers donated
to the program where nothing else holds them: a whole training step written in the form
of `benchmarks.models.functional_train_step` is one program updating in place.

Shapes: XLA compiles for static shapes. A graph with symbolic sizes (`dynamic=True`,
`mark_dynamic`, or Dynamo's automatic dynamic shapes after a shape change) runs through
`dynamic.py`: sizes are padded to buckets (`options={"buckets": [...]}`, default powers
of two) with masking where padding would change a result; with `buckets=None` each
concrete shape gets its own program.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
from typing import Any, Sequence

import torch
import torch._functorch.config
from torch._decomp import core_aten_decompositions, decomposition_table
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import register_backend

from tpu_backend.compile import graph_cache, scan
from tpu_backend.compile.compiled_graph import (  # noqa: F401  (public here too)
    _DEFAULT_BUCKETS,
    BACKWARD,
    FORWARD,
    CompiledGraph,
    compile_for_tpu,
    compiles_ahead,
    graph_compiler,
    graph_identity,
)
from tpu_backend.compile.interop import BACKEND_NAME
from tpu_backend.compile.interpreter import is_covered, lowering_tables_version
from tpu_backend.kernels import upcast_inside_cross_entropy

_graph_ids = itertools.count()


class DynamicShapesNotSupported(RuntimeError):
    """Kept for compatibility: `dynamic=True` is accepted now (sizes are bucketed, `dynamic.py`)."""


def decompositions() -> dict:
    """Decompositions for every op our tables do not lower directly.

    Core ATen's set first; for ops outside it that we still lack (`addmm`, `gelu`...,
    while the table grows), PyTorch's full table. Ops the table covers are kept whole.
    Computed once per state of the lowering tables (it takes a few hundred ms).
    """
    return dict(_decompositions_for(lowering_tables_version()))


@functools.lru_cache(maxsize=4)
def _decompositions_for(tables_version) -> dict:
    table = {op: fn for op, fn in decomposition_table.items() if not is_covered(op) and not _decomposes_itself(op)}
    table.update((op, fn) for op, fn in core_aten_decompositions().items() if not is_covered(op))
    return table


def _decomposes_itself(op) -> bool:
    """CompositeImplicit ops (`dropout`, `linear`...) break into their ATen parts during
    tracing anyway; the table's versions of them are often worse (in-place RNG ops)."""
    if not isinstance(op, torch._ops.OpOverload):  # higher-order ops have no dispatcher entry
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _bucket_option(options: dict | None):
    """`options={"buckets": [8, 16, 32]}` (or "powers_of_two", or None: exact shapes)."""
    options = dict(options or {})
    buckets = options.pop("buckets", _DEFAULT_BUCKETS)
    if options:
        raise ValueError(f"torch.compile(backend='tpu'): unknown options {sorted(options)}; known: ['buckets']")
    return buckets


def tpu(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None, **kwargs):
    """Dynamo backend: AOTAutograd forward/backward graphs, each run as one jitted JAX program."""
    buckets = _bucket_option(options)
    if graph_cache.enabled():  # AOTAutograd's own cache can store what we compile
        make_compiler = functools.partial(
            graph_cache.compiler, buckets=graph_cache.DEFAULT if buckets is _DEFAULT_BUCKETS else buckets
        )
        return with_graph_compilers(gm, example_inputs, make_compiler, cached=True, **kwargs)
    return with_graph_compilers(gm, example_inputs, functools.partial(graph_compiler, buckets=buckets), **kwargs)


def _partition_saving_random_values(joint_module: torch.fx.GraphModule, joint_inputs, **kwargs):
    """AOTAutograd's default partition, with the random values of a checkpointed region
    (`torch.utils.checkpoint`: gradient checkpointing with dropout) saved for the backward
    instead of drawn again there. Drawing them again takes `run_and_save_rng_state` and
    `run_with_rng_state`, which hand a CPU generator's state from the forward to the backward
    and have no tpu form (the graph failed to compile); a dropout mask is saved instead."""
    from torch._functorch import partitioners
    from torch.utils.checkpoint import CheckpointPolicy

    for node in joint_module.graph.nodes:
        if partitioners.must_recompute(node) and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            for value in (node, *(user for user in node.users if user.target is operator.getitem)):  # (its outputs)
                value.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return partitioners.default_partition(joint_module, joint_inputs, **kwargs)


def with_graph_compilers(gm: torch.fx.GraphModule, example_inputs, make_compiler, cached: bool = False, **kwargs):
    """AOTAutograd over a Dynamo graph as backend "tpu" runs it, each graph handed to the
    compiler `make_compiler(name)` returns (`divergence.py` hands checking ones); `cached`:
    the compilers' results may go to AOTAutograd's cache (`graph_cache.py`)."""
    graph_id = next(_graph_ids)
    upcast_inside_cross_entropy(gm)  # `cross_entropy(x.float())` of 16-bit logits: no float32 copy kept
    backend = aot_autograd(
        fw_compiler=make_compiler(f"torch_compile_{graph_id}{FORWARD}"),
        bw_compiler=make_compiler(f"torch_compile_{graph_id}{BACKWARD}"),
        inference_compiler=make_compiler(f"torch_compile_{graph_id}_inference"),
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
        partition_fn=_partition_saving_random_values,
    )
    # With programs compiled ahead, AOTAutograd hands the backward graph over with the
    # forward (by default at the first backward), so the two compile at once.
    eager_backward = torch._functorch.config.patch(force_non_lazy_backward_lowering=compiles_ahead())
    with graph_cache.compiling() if cached else contextlib.nullcontext(), scan.schema_checked_once(), eager_backward:
        return backend(gm, example_inputs, **kwargs)


def _register_with_dynamo() -> None:
    """Make `backend="tpu"` resolve to `tpu`, once.

    `import tpu_backend` registered a forwarder under the name (`integrations/dynamo.py`:
    the checkout may not be installed, so no entry point names it); it is replaced by this
    backend here (told by its `forwards_to_compile_backend` mark: the forwarder sits above
    this module, which does not import it). When Dynamo imports this module through the `torch_dynamo_backends` entry
    point it registers the loaded function itself, and registering here too would be a
    duplicate.
    """
    from importlib.metadata import EntryPoint

    from torch._dynamo.backends import registry

    if getattr(registry._COMPILER_FNS.get(BACKEND_NAME), "forwards_to_compile_backend", False):
        del registry._COMPILER_FNS[BACKEND_NAME]
    if BACKEND_NAME in registry._COMPILER_FNS or isinstance(registry._BACKENDS.get(BACKEND_NAME), EntryPoint):
        return
    register_backend(tpu, name=BACKEND_NAME)


def _capturable_on_the_device() -> None:
    """A compiled optimizer step keeps its step counts on the device, as on CUDA.

    When Dynamo traces `optimizer.step` it makes a fresh optimizer `capturable` (step
    counts as device tensors) only where every parameter is on CUDA or XPU. Elsewhere the
    counts stay CPU tensors that the compiled step writes back, and each write-back waits
    for the device: on a TPU v5e the 374M Llama step spent 400 ms in `opt.step` (the
    whole backward's wait) instead of enqueueing. torch's AdamW, Adam and SGD support
    `capturable` on this device (privateuse1), so parameter groups on it get the same
    treatment before Dynamo's own check.
    """
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = OptimizerVariable._set_capturable
    if getattr(original, "_tpu_backend", False):
        return

    def set_capturable(self, tx) -> None:
        for group in self.value.param_groups:
            params = group.get("params", [])
            if (
                "capturable" in group
                and params
                and all(p.device.type == BACKEND_NAME and p not in self.value.state for p in params)
            ):
                group["capturable"] = True
        original(self, tx)

    set_capturable._tpu_backend = True
    OptimizerVariable._set_capturable = set_capturable


_register_with_dynamo()
_capturable_on_the_device()


__all__ = [
    "BACKEND_NAME",
    "CompiledGraph",
    "DynamicShapesNotSupported",
    "compile_for_tpu",
    "compiles_ahead",
    "graph_compiler",
    "decompositions",
    "tpu",
]
