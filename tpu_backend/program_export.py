"""`tpu_backend.export` (this module: `tpu_backend.program_export`): the program a "tpu" module runs, as a `jax.export.Exported`.

    exported = tpu_backend.export(model, (tokens,), platforms=("tpu",), train_step=True)
    exported.mlir_module()        # StableHLO; Pallas kernels appear as tpu_custom_call
    blob = exported.serialize()   # jax.export.deserialize(blob) on the serving side

How: the call is traced to an ATen FX graph with `make_fx` on fake "tpu" tensors (so
parameters may live on the `meta` device: nothing is allocated), through the device's
own routers (the kernel decisions of `tpu_backend.kernels`) and the Dynamo backend's
decompositions; the graph is then run by the same interpreter and op table as
`torch.compile(backend="tpu")` (`tpu_backend.compile.fx_to_jax`) inside `jax.jit`, and
exported for `platforms`. When the platforms are TPU only, tracing and lowering happen
inside `kernels.tpu.lowering_for(chip)`, so kernel mode "auto" picks the compiled Pallas
kernels there as it would on that chip (and the router applies that chip's rules).

The exported function takes the flat JAX arrays `(*parameters, *buffers, *tensor args)`
in `named_parameters()` / `named_buffers()` order (a random key first when the program
draws random numbers, e.g. dropout) and returns the module's tensor outputs; with
`train_step=True` the module (or function) must return a scalar loss and the program
returns `(loss, *gradients)`, one gradient per parameter. Buffers are read, not updated:
the call's updates (BatchNorm running statistics) are not outputs of the program.
"""

from __future__ import annotations

import contextlib

import torch
import torch.utils._pytree as pytree

BACKEND = "tpu"


def _fake_like(value, fake_mode):
    """A fake "tpu" tensor with `value`'s shape and dtype (no storage, any source device)."""
    with fake_mode:
        return torch.empty(tuple(value.shape), dtype=value.dtype, device=BACKEND)


def _module_state(module_or_fn):
    if isinstance(module_or_fn, torch.nn.Module):
        return dict(module_or_fn.named_parameters()), dict(module_or_fn.named_buffers())
    return {}, {}


def _traced_graphs(module_or_fn, args, kwargs, train_step):
    """AOTAutograd's forward (and backward) ATen graphs of the call on fake tpu tensors,
    captured exactly as `torch.compile(backend="tpu")` receives them."""
    from functorch.compile import aot_function, make_boxed_func
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tpu_backend.compile import decompositions

    params, buffers = _module_state(module_or_fn)
    flat_args, spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    tensor_positions = [i for i, a in enumerate(flat_args) if isinstance(a, torch.Tensor)]
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_params = [_fake_like(p, fake_mode) for p in params.values()]
    fake_rest = [_fake_like(b, fake_mode) for b in buffers.values()]
    fake_rest += [_fake_like(flat_args[i], fake_mode) for i in tensor_positions]
    names = list(params) + list(buffers)

    def call(*flat):
        state = dict(zip(names, flat[: len(names)]))
        for name in buffers:  # updates (BatchNorm running stats) stay inside the program
            state[name] = state[name].clone()
        values = list(flat_args)
        for position, tensor in zip(tensor_positions, flat[len(names) :]):
            values[position] = tensor
        call_args, call_kwargs = pytree.tree_unflatten(values, spec)
        if isinstance(module_or_fn, torch.nn.Module):
            out = torch.func.functional_call(module_or_fn, state, call_args, call_kwargs)
        else:
            out = module_or_fn(*call_args, **call_kwargs)
        if train_step:
            if not isinstance(out, torch.Tensor) or out.numel() != 1:
                raise ValueError(
                    f"tpu_backend.export(train_step=True): the call must return a scalar loss, got {_describe(out)}"
                )
            return (out.reshape(()),)
        return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))

    graphs = {}

    def capture(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = gm
            return make_boxed_func(gm.forward)

        return compiler

    compiled = aot_function(
        call, fw_compiler=capture("forward"), bw_compiler=capture("backward"), decompositions=decompositions()
    )
    if train_step:
        for p in fake_params:
            p.requires_grad_(True)
        with torch.enable_grad(), fake_mode:
            (loss,) = compiled(*fake_params, *fake_rest)
            loss.backward()
    else:
        with torch.no_grad(), fake_mode:
            compiled(*fake_params, *fake_rest)
    return graphs, len(fake_params)


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _abstract(value):
    import jax

    from tpu_backend.ops.registry import jax_dtype

    return jax.ShapeDtypeStruct(tuple(value.shape), jax_dtype(value.dtype))


def _output_names(graph_module) -> list:
    return [
        n.name if isinstance(n, torch.fx.Node) else None
        for n in next(n for n in reversed(graph_module.graph.nodes) if n.op == "output").args[0]
    ]


def _joint(forward, backward, n_params: int, output_names: list):
    """(loss, *parameter gradients) from AOTAutograd's two graphs as one JAX function:
    the backward's saved-value inputs are the forward's outputs of the same name, named as
    AOTAutograd made them (`output_names`: graph passes may replace an output node)."""
    from tpu_backend.compile import fx_to_jax

    fw, bw = fx_to_jax(forward, "export_forward"), fx_to_jax(backward, "export_backward")
    sources = []
    for placeholder in bw.placeholders:
        if placeholder.name.startswith("tangents"):
            sources.append(None)  # d loss / d loss
        else:
            sources.append(output_names.index(placeholder.name))

    def step(key, *inputs):
        import jax.numpy as jnp

        key, outputs = fw.run(inputs, key)
        loss = outputs[0]
        grads = bw.run([jnp.ones_like(loss) if s is None else outputs[s] for s in sources], key)[1]
        grads = [jnp.zeros(x.shape, x.dtype) if g is None else g for g, x in zip(grads[:n_params], inputs)]
        return key, (loss, *grads)

    return step, fw.needs_rng or bw.needs_rng


def export(module_or_fn, args, kwargs=None, *, platforms=("tpu",), train_step=False, chip=None):
    """The StableHLO program of `module_or_fn(*args, **kwargs)` on the "tpu" device, for
    `platforms`, as a `jax.export.Exported` (see the module docstring for its signature).
    `chip` names the TPU the kernels are lowered and checked for (`kernels.tpu.CHIPS`)."""
    import jax

    from kernels import tpu
    from tpu_backend.compile import fx_to_jax
    from tpu_backend.kernels import fuse_residual_norms

    platforms = tuple(platforms)
    if platforms == ("tpu",):
        target = tpu.lowering_for(chip)
    elif "tpu" not in platforms:  # (on a TPU machine too: a Mosaic call lowers for no other platform)
        target = tpu.lowering_for_host()
    else:
        target = contextlib.nullcontext()
    params, buffers = _module_state(module_or_fn)
    flat_args = pytree.tree_leaves((tuple(args), dict(kwargs or {})))
    abstract = [_abstract(t) for t in (*params.values(), *buffers.values(), *flat_args) if isinstance(t, torch.Tensor)]
    with target:
        graphs, n_params = _traced_graphs(module_or_fn, args, kwargs, train_step)
        forward_outputs = _output_names(graphs["forward"])  # before the pass below replaces saved `add`s
        for gm in graphs.values():
            fuse_residual_norms(gm)
        if train_step:
            step, needs_rng = _joint(graphs["forward"], graphs["backward"], n_params, forward_outputs)
        else:
            forward = fx_to_jax(graphs["forward"], "export")
            step, needs_rng = (lambda key, *xs: forward.run(xs, key)), forward.needs_rng
        if needs_rng:
            key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
            return jax.export.export(jax.jit(lambda k, *xs: tuple(step(k, *xs)[1])), platforms=platforms)(
                key, *abstract
            )
        return jax.export.export(jax.jit(lambda *xs: tuple(step(None, *xs)[1])), platforms=platforms)(*abstract)
