"""Block sizes for every kernel, per backend and shape: the one place to tune them.

Keys: "tpu", "gpu" (compiled Pallas) and "interpret" (Pallas's interpreter, any
backend). Rules of thumb behind the numbers:
- TPU: blocks whose last two dims are multiples of (8, 128) fill the vector unit and
  the MXU; 128-row query blocks and 128-512 key blocks keep K/V tiles in VMEM.
- GPU (Triton): block dims must be powers of two; 64x64 attention tiles keep a
  head-dim-128 tile in registers/shared memory; smaller for head dim 256.
- Interpret mode costs roughly 0.1 ms per grid point and per loop step, so blocks are
  as large as the shape allows (tests pass smaller blocks explicitly to exercise tiling).

`kernels.tuning.override(kernel, **blocks)` replaces a rule's answer (for benchmarks and
tests); it is a context manager.
"""

from __future__ import annotations

import contextlib


def _pow2_at_most(n: int, cap: int, floor: int = 8) -> int:
    """The largest power of two <= min(n, cap), at least `floor`."""
    size = floor
    while size * 2 <= min(n, cap):
        size *= 2
    return size


def _attention(backend: str, seq_q: int, seq_k: int, head_dim: int) -> dict:
    if backend == "tpu":
        return {"block_q": min(128, _pow2_at_most(seq_q, 128)), "block_k": min(512, _pow2_at_most(seq_k, 512, 128))}
    if backend == "gpu":
        cap = 32 if head_dim > 128 else 64
        return {"block_q": _pow2_at_most(seq_q, cap, 16), "block_k": _pow2_at_most(seq_k, cap, 16)}
    return {"block_q": _pow2_at_most(seq_q, 256), "block_k": _pow2_at_most(seq_k, 256)}


def _decode_attention(backend: str, seq_k: int, head_dim: int) -> dict:
    if backend == "tpu":
        return {"block_k": _pow2_at_most(seq_k, 512, 128)}
    if backend == "gpu":
        return {"block_k": _pow2_at_most(seq_k, 64 if head_dim > 128 else 128, 16)}
    return {"block_k": _pow2_at_most(seq_k, 512)}


def _norm(backend: str, rows: int, dim: int) -> dict:
    if backend == "tpu":
        # about 2 MiB of float32 per input tile
        return {"block_rows": _pow2_at_most(rows, max(8, (1 << 19) // max(dim, 1)))}
    if backend == "gpu":
        return {"block_rows": _pow2_at_most(rows, 16, 1)}
    return {"block_rows": _pow2_at_most(rows, 1024)}


def _cross_entropy(backend: str, rows: int, vocab: int) -> dict:
    if backend == "tpu":
        return {"block_rows": _pow2_at_most(rows, 128), "block_vocab": _pow2_at_most(vocab, 2048, 128)}
    if backend == "gpu":
        return {"block_rows": _pow2_at_most(rows, 16, 16), "block_vocab": _pow2_at_most(vocab, 1024, 128)}
    return {"block_rows": _pow2_at_most(rows, 512), "block_vocab": _pow2_at_most(vocab, 8192)}


_RULES = {
    "attention": _attention,
    "decode_attention": _decode_attention,
    "norm": _norm,
    "cross_entropy": _cross_entropy,
}
_OVERRIDES: dict[str, dict] = {}


def blocks(kernel: str, backend: str, *shape: int) -> dict:
    """Block sizes for `kernel` ("attention", "decode_attention", "norm",
    "cross_entropy") on `backend` ("tpu", "gpu", "interpret") for a problem `shape`."""
    if kernel not in _RULES:
        raise KeyError(f"no tuning rule for kernel {kernel!r}; known: {', '.join(_RULES)}")
    return {**_RULES[kernel](backend, *shape), **_OVERRIDES.get(kernel, {})}


@contextlib.contextmanager
def override(kernel: str, **block_sizes: int):
    """Force block sizes for `kernel` inside the block, e.g. `override("attention", block_q=16)`.
    Programs traced inside keep these sizes (jit caches key on shapes, not on this)."""
    if kernel not in _RULES:
        raise KeyError(f"no tuning rule for kernel {kernel!r}; known: {', '.join(_RULES)}")
    previous = _OVERRIDES.get(kernel)
    _OVERRIDES[kernel] = {**(previous or {}), **block_sizes}
    try:
        yield
    finally:
        if previous is None:
            _OVERRIDES.pop(kernel, None)
        else:
            _OVERRIDES[kernel] = previous
