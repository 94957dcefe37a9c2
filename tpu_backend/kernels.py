"""Which implementation the "tpu" device uses for attention, norms and cross-entropy:
the Pallas kernels of the `kernels/` package or the plain XLA lowerings.

    import tpu_backend
    tpu_backend.kernels.mode()                 # "auto"
    tpu_backend.kernels.implementation()       # "reference" on CPU/GPU, "pallas" on TPU
    with tpu_backend.kernels.use("interpret"):  # force the kernels (Pallas interpreter)
        loss = model(x)
    tpu_backend.kernels.use("off")             # a plain call sets the mode for good

Modes (also `TPU_KERNELS=auto|on|off|interpret` in the environment):
- "auto" (default): compiled Pallas kernels where JAX runs on a TPU (or lowers for one,
  inside `kernels.tpu.lowering_for`), the XLA reference elsewhere;
- "on": the kernels everywhere (compiled on a TPU, interpreted elsewhere);
- "interpret": the kernels through Pallas's interpreter, on any backend (debugging);
- "off": never the kernels.

Where it acts: `F.scaled_dot_product_attention`, `nn.LayerNorm`/`F.layer_norm`,
`nn.RMSNorm`/`F.rms_norm` and `F.cross_entropy` on "tpu" tensors. These ATen ops are
composite (they decompose before reaching a backend), so each gets ONE router, on the
`AutogradPrivateUse1` key (and `PrivateUse1`, which `torch.inference_mode()` reaches): when the mode picks a kernel and the call is one the kernel
covers, it calls the `torch.ops.tpu_kernels.*` custom op (with its own autograd);
otherwise it runs the op's usual decomposition. `stats()` counts both outcomes with the
reason for each fallback. Calls the kernels do not cover: SDPA with dropout, a mask that
requires grad, head dims outside 32/64/128/256, inputs not 4-D; cross-entropy with class
weights, label smoothing, probability targets or inputs not (N, C). For the compiled TPU
kernels also any call whose blocks break the TPU layout rule or exceed the chip's scoped
VMEM, or whose dtype Mosaic does not take (float16): the same rule functions
`python -m kernels.check_lowering` lowers with (`kernels.check_lowering.*_rejection`).

The choice is made when an op runs (eager) or is traced (`torch.compile`, fused
graphs): a compiled function keeps the implementation it was traced with until it
recompiles (`torch._dynamo.reset()`). Block sizes: `kernels/tuning.py`.

Under `torch.compile`, `fuse_residual_norms` (a graph pass) turns `norm(x + r)` into the
norm kernel that does the residual add itself; in eager code call `rms_norm(x, w,
residual=r)` / `layer_norm(...)` below.
"""

from __future__ import annotations

import collections
import functools
import math
import operator

import torch

from tpu_backend.kernel_mode import MODES, implementation, mode, set_mode, use  # noqa: F401  (public names here)

_STATS: collections.Counter = collections.Counter()


def stats() -> dict[str, int]:
    """Calls per "op: kernel" and "op: xla (reason)" since the last `reset_stats()`."""
    return dict(_STATS)


def reset_stats() -> None:
    _STATS.clear()


# --------------------------------------------------------------------------- routers


def chip() -> str:
    """The TPU chip the compiled kernels are checked against: the one being lowered for
    (`kernels.tpu.lowering_for`), else JAX's first device's, else the smallest of the table."""
    from kernels import tpu

    return tpu.target_chip() or _devices_chip()


@functools.cache
def _devices_chip() -> str:
    import jax

    from kernels import tpu

    kind = jax.devices()[0].device_kind
    return next((c.name for c in tpu.CHIPS.values() if c.device_kind == kind), tpu.DEFAULT_CHIP)


# Where "auto" leaves a compiled kernel for XLA because XLA was measured faster on the chip
# (mode "on" always takes the kernel). Per op: the size below which XLA wins, what that
# size is, and the measurement behind the number (chip, date, shape, kernel vs XLA ms from
# `benchmarks/kernels/kernels_bench.py`). 0: no shape measured where XLA wins.
_ATTENTION_ON_V5E = (
    "v5e 2026-12-04, causal bf16, 16 heads of 128, 8192 tokens per call: fwd+bwd 3.66x XLA at sequence 1024, "
    "4.27x at 2048, 4.74x at 4096, 38.5x at 8192"
)
XLA_FASTER_BELOW: dict[str, tuple[int, str, str]] = {
    "scaled_dot_product_attention": (0, "key sequence", _ATTENTION_ON_V5E),
    "flash_attention": (0, "key sequence", _ATTENTION_ON_V5E),
    # the one measured shape, and below it (smaller calls favour XLA more: fixed per-call cost)
    "rms_norm": (
        16385,
        "rows",
        "v5e 2026-12-04, 16384 rows x 4096 bf16: fwd+bwd 1.419 ms, XLA 1.360 ms (forward alone 1.42x "
        "faster); with the residual add 2.231 ms, XLA 2.192 ms",
    ),
    "layer_norm": (0, "rows", "v5e 2026-12-04, 16384 rows x 4096 bf16: fwd+bwd 1.484 ms, XLA 1.898 ms"),
    "cross_entropy": (0, "vocabulary", "v5e 2026-12-04, 8192 rows x 32000 bf16: fwd+bwd 2.759 ms, XLA 5.012 ms"),
    "decode_attention": (0, "cache length", "not measured on a chip yet"),
}


def _xla_measured_faster(op_name: str, size: int | None) -> str | None:
    """Why "auto" leaves this call to XLA on speed (None: the kernel is not slower)."""
    floor, what, evidence = XLA_FASTER_BELOW.get(op_name, (0, "", ""))
    if mode() != "auto" or size is None or size >= floor:
        return None
    return f"XLA measured faster for {what} < {floor}: {evidence}"


# torch 2.13's custom-op autograd (the kernels' gradients) refuses torch.func transforms, and
# an autograd.Function called below a transform's level trips functorch's internal assert:
# under `torch.func.grad` (the one-program training step) the calls take the XLA path.
UNDER_TORCH_FUNC = "inside a torch.func transform: the kernels' autograd does not support it in torch 2.13"


def _route(op_name: str, gaps, tpu_rules=None, size: int | None = None) -> str | None:
    """Count the outcome; the implementation to use, or None for the XLA path.
    `gaps()` says why the kernel cannot take the call (None: it can); for the compiled
    TPU kernels, `tpu_rules(chip)` adds the layout and VMEM rules `kernels.check_lowering`
    compiles with, so a call no TPU kernel can take goes to XLA instead of failing, and
    `XLA_FASTER_BELOW` (in mode "auto") the sizes where XLA was measured faster."""
    impl = implementation()
    reason = f"mode {mode()}" if impl == "reference" else gaps()
    if reason is None and torch._C._are_functorch_transforms_active():
        reason = UNDER_TORCH_FUNC
    if reason is None and impl == "pallas" and tpu_rules is not None:
        reason = tpu_rules(chip()) or _xla_measured_faster(op_name, size)
    _STATS[f"{op_name}: xla ({reason})" if reason else f"{op_name}: kernel"] += 1
    return None if reason else impl


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


# Under a mesh each compiled kernel sees its shard (`kernels.sharded`): the rules are
# checked on the per-shard shapes (a vocabulary split over tp may break the TPU layout
# where the whole one does not).


def _attention_rules(query, key, attn_mask, is_causal):
    from kernels import sharded
    from kernels.check_lowering import attention_rejection

    q_shape, k_shape = tuple(query.shape), tuple(key.shape)
    if (km := sharded.current("pallas")) and query.ndim == 4 and key.ndim == 4:
        spec = sharded.attention_spec(km, q_shape, k_shape)
        q_shape, k_shape = sharded.shard_shape(km, q_shape, spec), sharded.shard_shape(km, k_shape, spec)
    mask_shape = None if attn_mask is None else tuple(attn_mask.shape)
    return lambda chip: attention_rejection(
        q_shape, k_shape, _dtype_name(query), causal=is_causal, mask_shape=mask_shape, chip=chip
    )


def _shard_rows(x) -> int:
    from kernels import sharded

    shape = tuple(x.shape)
    if (km := sharded.current("pallas")) and x.ndim:
        shape = sharded.shard_shape(km, shape, sharded.rows_spec(km, shape))
    return math.prod(shape[:-1]) if shape else 1


def _norm_rules(x, residual, weight, bias):
    from kernels.check_lowering import norm_rejection

    dim = x.shape[-1]
    return lambda chip: norm_rejection(
        _shard_rows(x),
        dim,
        _dtype_name(x),
        residual=residual is not None,
        weight=weight is not None,
        bias=bias is not None,
        chip=chip,
    )


def _cross_entropy_rules(logits):
    from kernels import sharded
    from kernels.check_lowering import cross_entropy_rejection

    shape = tuple(logits.shape)
    if (km := sharded.current("pallas")) and logits.ndim == 2:
        shape = sharded.shard_shape(km, shape, sharded.cross_entropy_spec(km, shape))
    return lambda chip: cross_entropy_rejection(*shape, _dtype_name(logits), chip=chip)


def _decode_rules(q, k_cache):
    from kernels.check_lowering import decode_rejection

    return lambda chip: decode_rejection(tuple(q.shape), tuple(k_cache.shape), _dtype_name(q), chip=chip)


def _attention_gaps(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """Why the flash kernel cannot take this call (None: it can)."""
    from kernels.flash_attention import SUPPORTED_HEAD_DIMS

    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        return "not 4-D"
    if dropout_p != 0.0:
        return "dropout"
    if attn_mask is not None and (attn_mask.requires_grad or is_causal):
        return "mask requires grad" if attn_mask.requires_grad else "mask and is_causal"
    if query.shape[-1] not in SUPPORTED_HEAD_DIMS or value.shape[-1] != query.shape[-1]:
        return f"head dim {query.shape[-1]}"
    if key.shape[1] != query.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        return "head counts"
    if not query.dtype.is_floating_point or len({query.dtype, key.dtype, value.dtype}) != 1:
        return "dtypes"
    return None


def _attention_as_one_op(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Fused eager mode records XLA-path attention as ONE op (`_scaled_dot_product_efficient_attention`,
    whose lowering is `ops/attention.py`'s `_attention`, with ATen's own C++ backward formula)
    instead of the ~10 ops and views of its decomposition: the same values (tests compare
    both with CPU), a fraction of the recording cost. Strict and debug modes keep the
    decomposition (one program per ATen op). Calls the one op does not model decompose."""
    from tpu_backend.eager import modes

    if modes._mode != "fused" or dropout_p != 0.0 or (attn_mask is not None and is_causal):
        return False
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4 or not query.dtype.is_floating_point:
        return False
    heads, kv_heads = query.shape[1], key.shape[1]
    return value.shape[1] == kv_heads and (kv_heads == heads or (enable_gqa and heads % kv_heads == 0))


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    impl = _route(
        "scaled_dot_product_attention",
        lambda: _attention_gaps(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa),
        _attention_rules(query, key, attn_mask, is_causal),
        key.shape[-2] if key.ndim >= 2 else None,
    )
    if impl is None:
        if _attention_as_one_op(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
            wants_lse = query.requires_grad or key.requires_grad or value.requires_grad
            return torch.ops.aten._scaled_dot_product_efficient_attention.default(
                query, key, value, attn_mask, wants_lse, 0.0, is_causal, scale=scale
            )[0]
        return torch.ops.aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return torch.ops.tpu_kernels.flash_attention(query, key, value, attn_mask, is_causal, scale, impl)[0]


def _rows(x) -> int:
    return x.numel() // max(x.shape[-1], 1) if x.ndim else 1


def _norm_gaps(x, normalized_shape, weight, bias) -> str | None:
    if len(normalized_shape) != 1 or x.ndim == 0:
        return "normalized over several dims"
    if any(t is not None and t.dtype != x.dtype for t in (weight, bias)) or not x.dtype.is_floating_point:
        return "dtypes"
    return None


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    impl = _route(
        "layer_norm",
        lambda: _norm_gaps(x, normalized_shape, weight, bias),
        _norm_rules(x, None, weight, bias),
        _rows(x),
    )
    if impl is None:  # ATen's decomposition, without `decompose`'s dispatcher round trip
        return torch.native_layer_norm(x, normalized_shape, weight, bias, eps)[0]
    return torch.ops.tpu_kernels.norm(x, None, weight, bias, True, eps, impl)[0]


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    impl = _route(
        "rms_norm", lambda: _norm_gaps(x, normalized_shape, weight, None), _norm_rules(x, None, weight, None), _rows(x)
    )
    if impl is None:
        return torch.ops.aten.rms_norm.default.decompose(x, normalized_shape, weight, eps)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return torch.ops.tpu_kernels.norm(x, None, weight, None, False, eps, impl)[0]


def _cross_entropy_gaps(logits, target, weight, label_smoothing) -> str | None:
    if logits.ndim != 2 or target.ndim != 1 or target.dtype not in (torch.int64, torch.int32):
        return "not (N, C) logits with class indices"
    if weight is not None:
        return "class weights"
    if label_smoothing != 0.0:
        return "label smoothing"
    return None


def _cross_entropy(logits, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0, upcast=False):
    """The router of `aten::cross_entropy_loss`; `upcast`: the loss of `logits.float()`,
    with the 16-bit logits handed to the kernel whole (it computes in float32 itself)."""
    impl = _route(
        "cross_entropy",
        lambda: _cross_entropy_gaps(logits, target, weight, label_smoothing),
        _cross_entropy_rules(logits),
        logits.shape[-1] if logits.ndim else None,
    )
    if impl is None:
        return torch.ops.aten.cross_entropy_loss.default.decompose(
            logits.float() if upcast else logits, target, weight, reduction, ignore_index, label_smoothing
        )
    losses = torch.ops.tpu_kernels.cross_entropy(logits, target, ignore_index, impl)[0]
    dtype = torch.float32 if upcast else logits.dtype
    if reduction == 0:
        return losses.to(dtype)
    total = losses.sum()
    if reduction == 2:
        return total.to(dtype)
    return (total / (target != ignore_index).sum()).to(dtype)


def cross_entropy_in_float32(
    input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean", label_smoothing=0.0
):
    """`F.cross_entropy(input.float(), ...)` of 16-bit logits (what `upcast_inside_cross_entropy`
    puts in a graph): the kernel reads the 16-bit logits and computes in float32, so no
    float32 copy of the logits is written, kept for the backward and read again (8192 x 32000
    logits: 1 GB of the forward's outputs), and the gradient comes back 16-bit, rounded
    once as the cast's backward would round it. Off the kernel: the call it replaces."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    enum = torch.nn._reduction.get_enum(reduction)
    return _cross_entropy(input, target, weight, enum, ignore_index, label_smoothing, upcast=True)


_ROUTERS = {
    "scaled_dot_product_attention": _sdpa,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "cross_entropy_loss": _cross_entropy,
}


def install() -> None:
    """Define the custom ops and register the routers (idempotent; called by `import tpu_backend`)."""
    import tpu_backend.kernel_ops  # noqa: F401  (defines torch.ops.tpu_kernels.* and their tpu lowerings)
    from tpu_backend.dispatch import register_kernel

    for name, router in _ROUTERS.items():
        op = getattr(torch.ops.aten, name).default
        register_kernel(op, router, key="AutogradPrivateUse1")
        register_kernel(op, router, key="PrivateUse1")  # reached directly under torch.inference_mode()


# --------------------------------------------------------------------------- direct calls


def _direct(op_name: str, tpu_rules, size: int | None = None) -> str:
    """The implementation for a direct call: the mode's, or the custom op's XLA reference
    when the compiled kernel cannot take it (counted like the routers' fallbacks)."""
    return _route(op_name, lambda: None, tpu_rules, size) or "reference"


def flash_attention(q, k, v, mask=None, *, causal=False, scale=None):
    """`torch.ops.tpu_kernels.flash_attention` with the mode's implementation (the
    reference when the mode is off/auto on CPU). k/v may have fewer heads (GQA)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    impl = _direct("flash_attention", _attention_rules(q, k, mask, causal), k.shape[-2])
    return torch.ops.tpu_kernels.flash_attention(q, k, v, mask, causal, scale, impl)[0]


def rms_norm(x, weight=None, *, eps=1e-6, residual=None):
    """RMSNorm over the last dim; with `residual` returns (rms_norm(x + residual), x + residual)."""
    impl = _direct("rms_norm", _norm_rules(x, residual, weight, None), _rows(x))
    y, h = torch.ops.tpu_kernels.norm(x, residual, weight, None, False, eps, impl)
    return y if residual is None else (y, h)


def layer_norm(x, weight=None, bias=None, *, eps=1e-5, residual=None):
    """LayerNorm over the last dim; with `residual` returns (layer_norm(x + residual), x + residual)."""
    impl = _direct("layer_norm", _norm_rules(x, residual, weight, bias), _rows(x))
    y, h = torch.ops.tpu_kernels.norm(x, residual, weight, bias, True, eps, impl)
    return y if residual is None else (y, h)


def decode_attention(q, k_cache, v_cache, lengths, *, scale=None):
    """One query token per sequence over its KV cache; `lengths` (B,) valid entries."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    impl = _direct("decode_attention", _decode_rules(q, k_cache), k_cache.shape[-2])
    return torch.ops.tpu_kernels.decode_attention(q, k_cache, v_cache, lengths, scale, impl)


# --------------------------------------------------------------------------- graph pass


def _fusable_add(add, norm_node, order: dict) -> bool:
    """`add` is `a + b` of two same-shape, same-dtype tensors whose other readers all run
    after `norm_node` (the fused node takes the norm's place in the graph)."""
    if add.op != "call_function" or add.target is not torch.ops.aten.add.Tensor or add.kwargs.get("alpha", 1) != 1:
        return False
    if len(add.args) != 2 or not all(isinstance(t, torch.fx.Node) for t in add.args):
        return False
    values = [t.meta.get("val") for t in (*add.args, add)]
    if any(not isinstance(v, torch.Tensor) for v in values):
        return False
    if any(v.shape != values[-1].shape or v.dtype != values[-1].dtype for v in values[:-1]):
        return False
    return all(order[user] > order[norm_node] for user in add.users if user is not norm_node)


def fuse_residual_norms(gm: torch.fx.GraphModule) -> int:
    """Graph pass for `torch.compile` graphs: `h = x + r; tpu_kernels.norm(h, None, ...)`
    becomes ONE `tpu_kernels.norm(x, r, ...)` that also returns h (the residual stream),
    so the add is done inside the norm kernel. Returns how many norms were fused."""
    norm_op = torch.ops.tpu_kernels.norm.default
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    fused_count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not norm_op or node.args[1] is not None:
            continue
        add = node.args[0]
        if not isinstance(add, torch.fx.Node) or not _fusable_add(add, node, order):
            continue
        if any(user.target is operator.getitem and user.args[1] == 1 for user in node.users):
            continue  # someone reads the (empty) residual output: leave it
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(norm_op, (add.args[0], add.args[1], *node.args[2:]), dict(node.kwargs))
            h = gm.graph.call_function(operator.getitem, (fused, 1))
        y, _ = node.meta["val"]
        fused.meta["val"] = (y, add.meta["val"])
        h.meta["val"] = add.meta["val"]
        node.replace_all_uses_with(fused)
        gm.graph.erase_node(node)
        add.replace_all_uses_with(h)
        gm.graph.erase_node(add)
        fused_count += 1
    if fused_count:
        gm.graph.lint()
        gm.recompile()
    return fused_count


_RESHAPES = frozenset({"view", "reshape", "contiguous", "flatten"})


def _commutes_with_upcast(node) -> bool:
    """A reshape or indexing (`x[..., :-1, :]`) of one tensor: applying it before the upcast
    gives the same values."""
    if node.op == "call_method":
        return node.target in _RESHAPES
    return node.op == "call_function" and node.target is operator.getitem


_HALF_DTYPES = (torch.bfloat16, torch.float16)

# `cross_entropy_in_float32` in a Dynamo graph leaves it cacheable by AOTAutograd (which
# admits torch's own functions and those named here with a version to key on).
CROSS_ENTROPY_IN_FLOAT32_VERSION = "1"


def _upcast_source(node):
    """The 16-bit tpu tensor node that `node` (`x.float()` / `x.to(torch.float32)`) upcasts, else None."""
    if node.op != "call_method" or len(node.users) != 1:
        return None
    if node.target == "float":
        upcast = len(node.args) == 1 and not node.kwargs
    elif node.target == "to":
        upcast = (node.args[1:], node.kwargs) in (((torch.float32,), {}), ((), {"dtype": torch.float32}))
    else:
        upcast = False
    source = node.args[0] if upcast else None
    value = source.meta.get("example_value") if isinstance(source, torch.fx.Node) else None
    fake = getattr(value, "fake_mode", None) is not None  # Dynamo's example values (reshapes are re-run on them)
    if fake and value.dtype in _HALF_DTYPES and value.device.type == "tpu":
        return source
    return None


def upcast_inside_cross_entropy(gm: torch.fx.GraphModule) -> int:
    """Graph pass for Dynamo's graphs: `F.cross_entropy(x.float(), t)` of a 16-bit `x`
    (reshapes and slices between the two allowed: the Hugging Face causal-LM loss is
    `logits.float()`, `.view(-1, vocab)`, `cross_entropy`; older versions shifted with
    `[..., :-1, :].contiguous()`) becomes `cross_entropy_in_float32(x, t)`, the same loss
    with the upcast inside the kernel. Returns how many calls were rewritten."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.nn.functional.cross_entropy or not node.args:
            continue
        chain, current = [], node.args[0]  # reshapes and slices from the loss back to the upcast
        while isinstance(current, torch.fx.Node) and _commutes_with_upcast(current):
            if len(current.users) != 1:
                break
            chain.append(current)
            current = current.args[0]
        source = _upcast_source(current) if isinstance(current, torch.fx.Node) else None
        if source is None:
            continue
        (chain[-1] if chain else node).replace_input_with(current, source)
        gm.graph.erase_node(current)
        value = source.meta["example_value"]
        with value.fake_mode:  # the reshapes now see the 16-bit tensor
            for step in reversed(chain):
                args, kwargs = torch.fx.node.map_arg((step.args[1:], step.kwargs), lambda n: n.meta["example_value"])
                method = (
                    getattr(value, step.target) if step.op == "call_method" else functools.partial(step.target, value)
                )
                value = step.meta["example_value"] = method(*args, **kwargs)
        node.target = cross_entropy_in_float32
        rewritten += 1
    if rewritten:
        from torch._inductor import config as inductor_config

        inductor_config.unsafe_marked_cacheable_functions[f"{__name__}.{cross_entropy_in_float32.__name__}"] = (
            CROSS_ENTROPY_IN_FLOAT32_VERSION
        )
        gm.graph.lint()
        gm.recompile()
    return rewritten


class UpcastInsideCrossEntropy(torch.overrides.TorchFunctionMode):
    """`upcast_inside_cross_entropy` for code traced without Dynamo (the planner's and
    `TrainStep`'s step, `tpu_backend.aot.capture`): while the mode is on,
    `F.cross_entropy(x.float(), t)` of a 16-bit tpu `x`, with reshapes or indexing between,
    is called as `cross_entropy_in_float32` of `x` with the same reshapes. The upcast itself
    still runs (it is dead code unless something else reads it)."""

    _UPCASTS = (torch.Tensor.float, torch.Tensor.to)
    _COMMUTING = frozenset({*(getattr(torch.Tensor, name) for name in _RESHAPES), torch.Tensor.__getitem__})

    def __init__(self):
        super().__init__()
        self.half_of: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(upcast) -> (upcast, 16-bit form)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.cross_entropy and args and id(args[0]) in self.half_of:
            return cross_entropy_in_float32(self.half_of[id(args[0])][1], *args[1:], **kwargs)
        out = func(*args, **kwargs)
        source = args[0] if args else None
        if not isinstance(out, torch.Tensor) or not isinstance(source, torch.Tensor):
            return out
        if func in self._UPCASTS and _is_upcast(source, out, args[1:], kwargs):
            self.half_of[id(out)] = (out, source)
        elif func in self._COMMUTING and id(source) in self.half_of:
            self.half_of[id(out)] = (out, func(self.half_of[id(source)][1], *args[1:], **kwargs))
        return out


def _is_upcast(source: torch.Tensor, out: torch.Tensor, args, kwargs) -> bool:
    """`out` is `source.float()` / `source.to(torch.float32)` of a 16-bit tpu tensor, nothing else changed."""
    plain = (args, kwargs) in (((), {}), ((torch.float32,), {}), ((), {"dtype": torch.float32}))
    return plain and source.dtype in _HALF_DTYPES and source.device.type == "tpu" and out.dtype == torch.float32
