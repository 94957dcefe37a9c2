"""Device randomness: a functional `jax.random` key stream kept in this module.

PyTorch has no Python-side device generator, so the state is (seed, counter), like
CUDA's Philox (seed, offset): every random op gets `fold_in(key(seed), counter)` and
bumps the counter. `torch.manual_seed(s)` reaches `manual_seed_all` here through
`torch.tpu` (PyTorch seeds every registered device module), and the seed defaults to
`torch.initial_seed()`, so seeding torch makes dropout, `randn`, `nn.init`... on the
device reproducible.

An explicit generator (`torch.randn(..., generator=g, device="tpu")`; a CPU
`torch.Generator`, since PyTorch cannot make a Python backend's own) draws the op's key
from `g` instead (`key_from_generator`): re-seeding `g` repeats the numbers, `g`
advances as PyTorch's generators do, and the device stream is left alone. The numbers
are not CPU's.
"""

from __future__ import annotations

import functools
import io
import os
from typing import Callable

import jax
import numpy as np
import torch

_SEED_MASK = (1 << 63) - 1  # jax.random.key takes a signed 64-bit seed
_seed: int | None = None
_counter = 0


@functools.lru_cache(maxsize=8)
def _base_key(seed: int):
    return jax.random.key(seed)


_fold_in = jax.jit(jax.random.fold_in)


def manual_seed(seed: int) -> None:
    """Restart the device key stream from `seed`."""
    global _seed, _counter
    _seed, _counter = int(seed) & _SEED_MASK, 0


manual_seed_all = manual_seed


def seed() -> int:
    """Seed the device with a fresh random number and return it."""
    new_seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
    manual_seed(new_seed)
    return initial_seed()


def initial_seed() -> int:
    if _seed is None:
        manual_seed(torch.initial_seed())
    return _seed


def next_key():
    """A fresh `jax.random` key for one random op."""
    global _counter
    base = _base_key(initial_seed())
    key = _fold_in(base, np.uint32(_counter & 0xFFFFFFFF))
    _counter += 1
    return key


def key_from_generator(generator: torch.Generator):
    """The key of one random op called with `generator`: a seed drawn from it."""
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator)) & _SEED_MASK
    return jax.random.key(seed)


def _one_device(device) -> None:
    """`device` as torch.cuda's random-state functions take it (an index, a name, a
    torch.device): the tpu device has one, index 0."""
    index = device if isinstance(device, int) else torch.device(device).index
    if index not in (None, 0):
        raise RuntimeError(f"device {device} does not exist: the tpu device has one index (tpu:0)")


def get_rng_state(device="tpu") -> torch.Tensor:
    """The (seed, counter) state as 16 bytes, like torch.cuda.get_rng_state's ByteTensor."""
    _one_device(device)
    state = np.array([initial_seed(), _counter], dtype=np.int64)
    return torch.from_numpy(state.view(np.uint8).copy())


def set_rng_state(state: torch.Tensor, device="tpu") -> None:
    global _seed, _counter
    _one_device(device)
    values = state.detach().cpu().contiguous().numpy().view(np.int64)
    if values.shape != (2,):
        raise ValueError(f"tpu rng state must be the 16 bytes get_rng_state() returns, got {state.numel()} bytes")
    _seed, _counter = int(values[0]), int(values[1])


def save_into_states_file(path: str, key: str, load: Callable) -> None:
    """Add the device's random state under `key` to a checkpoint's file of random states
    (`load` reads it as its writer does), rewritten whole: Trainer and accelerate keep the
    CPU's and the accelerators' they know there, not this device's."""
    from common.files import write_atomic

    buffer = io.BytesIO()
    torch.save(dict(load(path), **{key: get_rng_state()}), buffer)
    write_atomic(path, [buffer.getvalue()])


def load_from_states_file(path: str, key: str, load: Callable) -> None:
    """Set the device's random state from `key` of a checkpoint's file, where it is there."""
    state = load(path).get(key) if os.path.isfile(path) else None
    if state is not None:
        set_rng_state(state)
