"""Index bounds in eager mode, checked as CUDA checks them: by the next synchronisation.

On CPU an index out of range is an IndexError. On the device a gather is an XLA program,
which clamps such an index: `torch.ones(3, device="tpu")[torch.tensor([5])]` gave
`tensor([1.])`, silently. Reading each index back before its op would make every indexing
op wait for the chip. As CUDA's device-side assertions do, the check waits instead: each
eager indexing op (strict or fused mode) records its index arrays (the arrays themselves,
a snapshot: a payload is replaced, never written) with the size each indexes, and starts
copying them to the host. The next time the host reads the device (`.item()`, `.cpu()`,
printing, `torch.tpu.synchronize()`), it checks them and raises the error PyTorch's CPU
kernel raises (IndexError; RuntimeError for gather, scatter and index_add), naming the op
and the line that called it, before the value is returned.

What it costs (an indexing op's host time, `TPU_INDEX_CHECKS=0` against the default, on
this CPU host; `python -m benchmarks.device.index_checks_bench`) is in
docs/measurements/device.md. Programs compiled by `torch.compile` are not checked (as
PyTorch's compiled kernels skip them unless asked); debug mode checks every op at once.
"""

from __future__ import annotations

import math
import os

import jax
import numpy as np
import torch

from tpu_backend import tensor as tpu_tensor
from tpu_backend.eager.errors import user_frame

aten = torch.ops.aten

# TPU_INDEX_CHECKS=0: indexing ops take the compiled dispatch path unchecked (read when each op's
# runner is made, at its first call)
ENABLED = os.environ.get("TPU_INDEX_CHECKS", "1") != "0"

# At most this many records wait for a synchronisation; past it the oldest whose arrays are
# on the host already are checked (a loop that never reads the device keeps its memory bounded).
MAX_PENDING = 4096


# (id of the index array, its view, the size, negatives allowed, the exempt value) -> (array,
# view, size, dim, negatives allowed, the exempt value, op, where): one entry per distinct
# check, in the order they were made
_pending: dict[tuple, tuple] = {}


def _dim(dim: int, rank: int) -> int:
    return dim + max(rank, 1) if dim < 0 else dim


def _size(t: torch.Tensor, dim: int) -> int:
    return t.shape[_dim(dim, t.dim())] if t.dim() else 1


# Per op: (index tensor, the size it indexes, the dim, negative ids allowed, a value exempt
# from the bounds or None) from the op's arguments, and the error PyTorch's CPU kernel raises;
# its rules too (advanced indexing, `take`, `put` and `index_fill` wrap negative indices, the
# others refuse them; a loss's target may be its ignore_index).
def _embedding(weight, indices, *rest, **kw):
    return [(indices, weight.shape[0], 0, False, None)]


def _along_dim(self, dim, index, *rest, **kw):
    return [(index, _size(self, dim), _dim(dim, self.dim()), False, None)]


def _along_dim_wrapping(self, dim, index, *rest, **kw):
    return [(index, _size(self, dim), _dim(dim, self.dim()), True, None)]


def _flat(self, index, *rest, **kw):
    return [(index, self.numel(), 0, True, None)]


def _loss_target(self, target, weight=None, reduction=1, ignore_index=-100, *rest, **kw):
    """nll_loss (cross_entropy's last op): each target a class of `self` (N, C, ...) or (C,),
    or the ignore_index."""
    return [(target, self.shape[0] if self.dim() == 1 else self.shape[1], 1, False, ignore_index)]


def _advanced(self, indices, *rest, **kw):
    """`x[i, :, j]` as `aten.index.Tensor`: each integer index tensor indexes the dim it
    stands at (a None keeps a dim; a boolean mask spans its own dims and is exact)."""
    checks, dim = [], 0
    for index in indices:
        if index is None:
            dim += 1
        elif index.dtype in (torch.bool, torch.uint8):
            dim += index.dim()
        else:
            checks.append((index, _size(self, dim), dim, True, None))
            dim += 1
    return checks


RULES = {
    aten.embedding.default: (_embedding, IndexError),
    aten._embedding_bag.default: (_embedding, IndexError),
    aten._embedding_bag_forward_only.default: (_embedding, IndexError),
    aten.index_select.default: (_along_dim, IndexError),
    aten.index_copy.default: (_along_dim, IndexError),
    aten.index_reduce.default: (_along_dim, IndexError),
    aten.index_fill.int_Scalar: (_along_dim_wrapping, IndexError),
    aten.index_fill.int_Tensor: (_along_dim_wrapping, IndexError),
    aten.gather.default: (_along_dim, RuntimeError),
    aten.scatter.src: (_along_dim, RuntimeError),
    aten.scatter.value: (_along_dim, RuntimeError),
    aten.scatter.reduce: (_along_dim, RuntimeError),
    aten.scatter.value_reduce: (_along_dim, RuntimeError),
    aten.scatter_add.default: (_along_dim, RuntimeError),
    aten.scatter_reduce.two: (_along_dim, RuntimeError),
    aten.index_add.default: (_along_dim, RuntimeError),
    aten.take.default: (_flat, IndexError),
    aten.put.default: (_flat, IndexError),
    aten.index.Tensor: (_advanced, IndexError),
    aten.index_put.default: (_advanced, IndexError),
    aten._index_put_impl.default: (_advanced, IndexError),
    aten.nll_loss_forward.default: (_loss_target, IndexError),
    aten.nll_loss2d_forward.default: (_loss_target, IndexError),
}


def record(op, args, kwargs) -> None:
    """After an eager indexing op ran (or was recorded): its index arrays, to check later."""
    where = None
    rule, _ = RULES[op]
    for index, size, dim, negative, exempt in rule(*args, **kwargs):
        if index.numel() == 0:
            continue
        where = where or user_frame()
        view = (index.storage_offset(), tuple(index.shape), tuple(index.stride()))
        if not tpu_tensor.is_tpu(index):  # host values: checked now
            host = index.detach().contiguous().numpy()
            _raise_if_out_of_range(host, (0, view[1], None), size, dim, negative, exempt, op, where)
            continue
        array = tpu_tensor.payload_of(index).array
        if isinstance(array, jax.Array):
            array.copy_to_host_async()  # on the host by the time anything waits for it
        key = (id(array), view, size, negative, exempt)
        _pending.setdefault(key, (array, view, size, dim, negative, exempt, op, where))
    if len(_pending) > MAX_PENDING:
        _check_ready()


def _values(host: np.ndarray, view) -> np.ndarray:
    """The index's values from its storage's (`view`: offset, shape, strides; None strides:
    contiguous from the offset)."""
    host = host.reshape(-1)
    offset, shape, strides = view
    if strides is None or (offset == 0 and host.size == math.prod(shape) and strides == _contiguous(shape)):
        return host[offset : offset + math.prod(shape)]
    return np.lib.stride_tricks.as_strided(host[offset:], shape, tuple(s * host.itemsize for s in strides))


def _contiguous(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _raise_if_out_of_range(host: np.ndarray, view, size, dim, negative, exempt, op, where) -> None:
    values = _values(host, view)
    low = -size if negative else 0
    outside = (values < low) | (values >= size)
    if exempt is not None:
        outside &= values != exempt
    if outside.any():
        bad = int(values[outside].flat[0])
        what = (
            f"Target {bad} is out of bounds (classes: {size})"
            if exempt is not None
            else (f"index {bad} is out of bounds for dimension {dim} with size {size}")
        )
        raise RULES[op][1](
            f"{what} ({op}, called from {where}; on the tpu device an indexing op's indices are "
            "checked when the host next reads the device)"
        )


def _check(entries: list) -> None:
    # one read for all (fused mode: a pending index, such as a slice of the labels, computed alone)
    arrays = jax.device_get([tpu_tensor.for_host(entry[0]) for entry in entries])
    for host, (_, *rest) in zip(arrays, entries):
        _raise_if_out_of_range(np.asarray(host), *rest)


def check_pending() -> None:
    """Check every recorded index (their arrays are computed once the host waits); raises the
    first out-of-range one's IndexError. Called where the host reads the device."""
    if _pending:
        entries = list(_pending.values())
        _pending.clear()
        _check(entries)


def _check_ready() -> None:
    """Past MAX_PENDING records: check the oldest half whose arrays are computed."""
    ready = []
    for key, entry in _pending.items():
        if len(ready) >= MAX_PENDING // 2 or not (isinstance(entry[0], jax.Array) and entry[0].is_ready()):
            break
        ready.append(key)
    _check([_pending.pop(key) for key in ready])


def discard_pending() -> None:
    """Forget the records (tests; a process that handled the error and goes on)."""
    _pending.clear()


tpu_tensor.on_host_read(check_pending)
