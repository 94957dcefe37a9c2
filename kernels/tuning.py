"""Block sizes for every kernel, per backend and shape: the one place to tune them.

Each kernel's blocks are a frozen dataclass (hashable: they are part of the static
config a jitted kernel is keyed by). Keys: "tpu" (compiled Pallas/Mosaic) and
"interpret" (Pallas's interpreter, any backend). Rules of thumb behind the numbers:
- TPU: the last two dims of every block are multiples of (8, 128) (Pallas's layout
  rule, `kernels.tpu.violations`); query and key blocks are multiples of 128 (full MXU
  passes, lane-dense per-row statistics); every program's blocks, double-buffered, stay
  well inside the smallest default scoped VMEM of `kernels.tpu.CHIPS` (16 MiB) whatever
  the sequence length or row count, because keys, vocabulary chunks and rows are tiled
  by the grid. `tests/kernels/test_tuning.py` checks every block this table produces.
- Interpret mode costs roughly 0.1 ms per grid point, so blocks are as large as the
  shape allows (tests pass smaller blocks explicitly to exercise tiling).

`kernels.tuning.override(kernel, **blocks)` replaces a rule's answer (for benchmarks and
tests); it is a context manager.
"""

from __future__ import annotations

import contextlib
import dataclasses

LANES = 128


@dataclasses.dataclass(frozen=True)
class AttentionBlocks:
    """Flash attention: query rows and key rows per program (forward and backward)."""

    block_q: int
    block_k: int


@dataclasses.dataclass(frozen=True)
class DecodeBlocks:
    """Decode attention: cache positions per program."""

    block_k: int


@dataclasses.dataclass(frozen=True)
class NormBlocks:
    """RMSNorm/LayerNorm: rows per program (a row is held whole)."""

    block_rows: int


@dataclasses.dataclass(frozen=True)
class CrossEntropyBlocks:
    """Cross-entropy: rows and vocabulary columns per program."""

    block_rows: int
    block_vocab: int


def _pow2_at_most(n: int, cap: int, floor: int = 8) -> int:
    """The largest power of two <= min(n, cap), at least `floor`."""
    size = floor
    while size * 2 <= min(n, cap):
        size *= 2
    return size


def _attention(backend: str, seq_q: int, seq_k: int, head_dim: int, itemsize: int = 4) -> AttentionBlocks:
    if backend == "tpu":
        # JAX 0.10.2's own TPU kernels default to 128 for every block
        # (`pallas.ops.tpu.flash_attention.BlockSizes.get_default` and splash's, both marked
        # "TODO: select better parameters"). 512 rows of queries and of keys instead: each
        # query block re-reads all of K and V, so at sequence 4096 (bf16, head dim 128)
        # block_q 128 moves 64 MiB of K/V per head against ~4 GFLOP (HBM-bound on a v5e:
        # ~80 us of traffic for ~22 us of MXU work), 512 moves 16 MiB; and a grid step costs
        # ~0.35 us, 16x fewer steps. Head dim 256 keeps 256 keys (the s/p tiles and the
        # accumulators stay the same size).
        # 16-bit inputs from sequence 2048 on: 1024 x 1024. Measured on a v5e (batch 4, 8
        # heads, 2048 x 128, causal bf16): forward 1.479 -> 1.114 ms, forward + backward
        # 2.786 -> 2.553 ms against 512 x 512 (JAX's splash kernel: 1.155 / 2.708); 256 or
        # 2048 rows were slower. float32 tiles at 1024 overflow v5e's 16 MiB scoped VMEM
        # (libtpu's compile, `python -m kernels.check_lowering`); below 2048 a 1024 block
        # would be the whole sequence and skip nothing past the causal diagonal.
        # `benchmarks/kernels/kernels_bench.py --sweep-blocks` measures the alternatives on the chip.
        big = 1024 if itemsize <= 2 and head_dim <= 128 and min(seq_q, seq_k) >= 2048 else 512
        block_k = _pow2_at_most(seq_k, big if head_dim <= 128 else 256, LANES)
        return AttentionBlocks(_pow2_at_most(seq_q, big, LANES), block_k)
    return AttentionBlocks(_pow2_at_most(seq_q, 256), _pow2_at_most(seq_k, 256))


def _decode_attention(backend: str, seq_k: int, head_dim: int) -> DecodeBlocks:
    if backend == "tpu":
        return DecodeBlocks(_pow2_at_most(seq_k, 1024 if head_dim <= 128 else 512, LANES))
    return DecodeBlocks(_pow2_at_most(seq_k, 512))


def _norm(backend: str, rows: int, dim: int) -> NormBlocks:
    if backend == "tpu":
        # about 1 MiB of float32 per row tile: forward with a residual moves four tiles,
        # double-buffered (8 MiB), inside v5e's 16 MiB scoped VMEM up to hidden 32k
        lanes = -(-dim // LANES) * LANES  # a row occupies whole 128-lane vregs
        return NormBlocks(_pow2_at_most(rows, max(8, (1 << 18) // lanes), 8))
    return NormBlocks(_pow2_at_most(rows, 1024))


def _cross_entropy(backend: str, rows: int, vocab: int) -> CrossEntropyBlocks:
    if backend == "tpu":
        return CrossEntropyBlocks(_pow2_at_most(rows, 128, 8), _pow2_at_most(vocab, 2048, LANES))
    return CrossEntropyBlocks(_pow2_at_most(rows, 512), _pow2_at_most(vocab, 8192))


_RULES = {
    "attention": _attention,
    "decode_attention": _decode_attention,
    "norm": _norm,
    "cross_entropy": _cross_entropy,
}
BACKENDS = ("tpu", "interpret")
_OVERRIDES: dict[str, dict] = {}


def blocks(kernel: str, backend: str, *shape: int):
    """Block sizes for `kernel` ("attention", "decode_attention", "norm",
    "cross_entropy") on `backend` ("tpu", "interpret") for a problem `shape`."""
    if kernel not in _RULES:
        raise KeyError(f"no tuning rule for kernel {kernel!r}; known: {', '.join(_RULES)}")
    if backend not in BACKENDS:
        raise KeyError(f"no tuning for backend {backend!r}; known: {', '.join(BACKENDS)}")
    return dataclasses.replace(_RULES[kernel](backend, *shape), **_OVERRIDES.get(kernel, {}))


def overrides() -> tuple:
    """The block sizes `override` forces now, hashable (a cache of anything `blocks` decides keys on it)."""
    return tuple((kernel, tuple(sorted(sizes.items()))) for kernel, sizes in sorted(_OVERRIDES.items()))


def with_explicit(tuned, **explicit):
    """`tuned` with the block sizes a caller passed (None: keep the tuned one)."""
    return dataclasses.replace(tuned, **{k: v for k, v in explicit.items() if v is not None})


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
