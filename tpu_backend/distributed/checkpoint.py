"""Sharded checkpoints: model and optimizer state saved shard by shard, restorable on
any mesh shape.

Layout of a checkpoint folder:

    index.json           format version; per tensor: global shape, dtype, and its pieces
                         (file, key, [start, stop) per dim); written last
    skeleton.pt          the state (model state_dict, optimizer state_dict, `extra`) with
                         every tpu tensor replaced by a TensorRef (CPU tensors, numbers,
                         param groups are stored here as they are)
    shard-<device>.npz   one file per device: the pieces of every tensor that this device
                         holds as its first replica (replicated data is written once)

Each process writes the files of its own devices, so no process ever gathers a whole
tensor. The folder is written as `<path>.tmp` and renamed into place once complete
(after a barrier across processes): a crash leaves the previous checkpoint intact.

Loading reads only the pieces that overlap each of this process's target shards: the
target sharding of a tensor is the one its parameter (or, for optimizer state, the
parameter it belongs to) has now, so a checkpoint saved on a 4x2 mesh loads onto an 8x1
mesh, or onto one device.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec
from torch.utils._pytree import tree_map

from tpu_backend import tensor as tpu_tensor
from tpu_backend.distributed.mesh import get_mesh
from tpu_backend.ops.registry import jax_dtype

FORMAT_VERSION = 1
_INDEX, _SKELETON = "index.json", "skeleton.pt"


@dataclass(frozen=True)
class TensorRef:
    """Stands for a tpu tensor in skeleton.pt: its entry in index.json."""

    key: str


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _storable(data: np.ndarray) -> np.ndarray:
    """numpy can save every dtype but bfloat16: store its bits (index.json keeps the dtype)."""
    return data.view(np.uint16) if data.dtype == jax.numpy.bfloat16 else data


def _bounds(index: tuple, shape: tuple) -> list[list[int]]:
    return [[s.start or 0, shape[d] if s.stop is None else s.stop] for d, s in enumerate(index)]


def save_checkpoint(
    path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, extra=None
) -> None:
    """Save `model`'s and `optimizer`'s state (and any picklable `extra`) into folder
    `path`, one file per device shard; every process of a multi-process run must call
    it. Replaces an existing checkpoint at `path` only once the new one is complete."""
    path = os.path.abspath(path)
    tmp = path + ".tmp"
    rank = jax.process_index()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier("tpu_checkpoint_start")

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None, "extra": extra}
    tensors: dict[str, dict] = {}
    per_device: dict[int, dict[str, np.ndarray]] = {}
    pieces: dict[str, list] = {}

    def to_ref(value):
        if not tpu_tensor.is_tpu(value):
            return value
        key = f"t{len(tensors)}"
        array = tpu_tensor.concrete(tpu_tensor.read(value))
        tensors[key] = {"shape": list(array.shape), "dtype": str(value.dtype).removeprefix("torch.")}
        pieces[key] = []
        for shard in array.addressable_shards:
            if shard.replica_id != 0:
                continue
            device = shard.device.id
            per_device.setdefault(device, {})[key] = _storable(np.asarray(shard.data))
            pieces[key].append({"file": f"shard-{device:05d}.npz", "bounds": _bounds(shard.index, array.shape)})
        return TensorRef(key)

    skeleton = tree_map(to_ref, state)
    for device, arrays in per_device.items():
        with open(os.path.join(tmp, f"shard-{device:05d}.npz"), "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
    with open(os.path.join(tmp, f"pieces-{rank:05d}.json"), "w") as f:
        json.dump(pieces, f)
    _barrier("tpu_checkpoint_written")

    if rank == 0:
        for key in tensors:
            tensors[key]["pieces"] = []
        for name in sorted(os.listdir(tmp)):
            if name.startswith("pieces-"):
                with open(os.path.join(tmp, name)) as f:
                    for key, found in json.load(f).items():
                        tensors[key]["pieces"].extend(found)
                os.remove(os.path.join(tmp, name))
        torch.save(skeleton, os.path.join(tmp, _SKELETON))
        with open(os.path.join(tmp, _INDEX), "w") as f:
            json.dump({"format_version": FORMAT_VERSION, "processes": jax.process_count(), "tensors": tensors}, f)
            f.flush()
            os.fsync(f.fileno())
        old = path + ".old"
        if os.path.exists(path):
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    _barrier("tpu_checkpoint_done")


class _PieceReader:
    """Reads checkpoint pieces lazily (each .npz member is loaded once per restore)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.files: dict[str, np.lib.npyio.NpzFile] = {}

    def piece(self, file: str, key: str) -> np.ndarray:
        if file not in self.files:
            self.files[file] = np.load(os.path.join(self.folder, file))
        return self.files[file][key]

    def region(self, key: str, entry: dict, index: tuple) -> np.ndarray:
        """The part `index` (a tuple of slices) of tensor `key`, assembled from its pieces."""
        shape = entry["shape"]
        wanted = _bounds(index, tuple(shape))
        dtype = jax_dtype(getattr(torch, entry["dtype"]))
        out = np.empty([stop - start for start, stop in wanted], dtype)
        covered = 0
        for piece in entry["pieces"]:
            overlap = [(max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(wanted, piece["bounds"])]
            if any(lo >= hi for lo, hi in overlap):
                continue
            data = self.piece(piece["file"], key)
            if data.dtype != dtype:
                data = data.view(dtype)
            src = tuple(slice(lo - b0, hi - b0) for (lo, hi), (b0, _) in zip(overlap, piece["bounds"]))
            dst = tuple(slice(lo - w0, hi - w0) for (lo, hi), (w0, _) in zip(overlap, wanted))
            out[dst] = data[src]
            covered += int(np.prod([hi - lo for lo, hi in overlap]))
        if covered < out.size:
            raise ValueError(
                f"checkpoint {self.folder}: the pieces of {key} do not cover {wanted}; is a shard file missing?"
            )
        return out

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _sharding_of(t: torch.Tensor):
    return tpu_tensor.concrete(tpu_tensor.read(t)).sharding


def _replicated_like(sharding):
    """Replicated over the same devices (a state tensor not shaped like its parameter)."""
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    return sharding  # one device


def _target_shardings(model, optimizer, skeleton, index) -> dict[int, object]:
    """id(TensorRef) -> the sharding the restored tensor must have."""
    targets = {}
    model_state = model.state_dict()
    for name, ref in skeleton["model"].items():
        if not isinstance(ref, TensorRef):
            continue
        current = model_state.get(name)
        if current is None or not tpu_tensor.is_tpu(current):
            where = "no such entry" if current is None else f"it on {current.device}"
            raise ValueError(f"the checkpoint has tpu tensor {name!r} but the model has {where}")
        saved = tuple(index["tensors"][ref.key]["shape"])
        if saved != tuple(current.shape):
            raise ValueError(f"{name}: shape {saved} in the checkpoint, {tuple(current.shape)} in the model")
        targets[id(ref)] = _sharding_of(current)
    if optimizer is not None and skeleton["optimizer"] is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for number, state in skeleton["optimizer"]["state"].items():
            param = params[number]
            for ref in state.values():
                if isinstance(ref, TensorRef):
                    same_shape = tuple(index["tensors"][ref.key]["shape"]) == tuple(param.shape)
                    sharding = _sharding_of(param)
                    targets[id(ref)] = sharding if same_shape else _replicated_like(sharding)
    return targets


def load_checkpoint(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
    """Restore `model` (and `optimizer`) from folder `path` onto the shardings they have
    now (apply DataParallel / fully_shard / parallelize_module first). Returns `extra`."""
    path = os.path.abspath(path)
    index_file = os.path.join(path, _INDEX)
    if not os.path.exists(index_file):
        raise FileNotFoundError(f"{path} is not a complete tpu checkpoint (no {_INDEX}); was the save interrupted?")
    with open(index_file) as f:
        index = json.load(f)
    if index.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: checkpoint format {index.get('format_version')}, this version reads {FORMAT_VERSION}"
        )
    with torch.serialization.safe_globals([TensorRef]):
        skeleton = torch.load(os.path.join(path, _SKELETON), weights_only=True)
    if optimizer is not None and skeleton["optimizer"] is None:
        raise ValueError(f"{path} holds no optimizer state (it was saved without an optimizer)")
    if optimizer is None:
        skeleton["optimizer"] = None  # not asked for: read none of its pieces
    targets = _target_shardings(model, optimizer, skeleton, index)
    # tpu tensors in `extra`: replicated over the model's devices
    fallback = next((_replicated_like(t) for t in targets.values()), None)
    reader = _PieceReader(path)

    def from_ref(ref):
        if not isinstance(ref, TensorRef):
            return ref
        entry = index["tensors"][ref.key]
        shape = tuple(entry["shape"])
        sharding = targets.get(id(ref), fallback) or NamedSharding(get_mesh(), PartitionSpec())
        array = jax.make_array_from_callback(shape, sharding, lambda idx: reader.region(ref.key, entry, idx))
        return tpu_tensor.wrap(array)

    try:
        state = tree_map(from_ref, skeleton)
    finally:
        reader.close()
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state["extra"]
