"""The tuning table (#22 item 8): every block it can produce for a TPU satisfies Pallas's
TPU layout rule and fits the smallest scoped VMEM of the chip table, for shapes from one
row to long contexts (ragged ones included); blocks are frozen dataclasses."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kernels import check_lowering, tpu, tuning

LENGTHS = (1, 7, 8, 100, 128, 129, 1000, 4096, 4097, 32768, 131072)
SMALLEST = min(tpu.CHIPS.values(), key=lambda c: c.scoped_vmem_bytes)


def _assert_tpu_ok(calls, what):
    for blocks in calls:
        assert tpu.violations(blocks, SMALLEST) == [], what
        assert tpu.vmem_bytes(blocks, SMALLEST) <= SMALLEST.scoped_vmem_bytes, what


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_attention_blocks(dtype):
    pairs = [(n, n) for n in LENGTHS] + [(1000, 4096), (4096, 1000), (7, 131072), (131072, 129)]
    for (seq, kv_seq), head_dim, (heads, kv_heads) in itertools.product(pairs, (32, 64, 128, 256), ((8, 8), (8, 1))):
        q, kv = (1, heads, seq, head_dim), (1, kv_heads, kv_seq, head_dim)
        for mask in (None, (1, 1, seq, kv_seq)):
            _assert_tpu_ok(check_lowering.attention_calls(q, kv, dtype, causal=True, mask_shape=mask), (q, kv, mask))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_norm_cross_entropy_decode_blocks(dtype):
    for rows, dim in itertools.product(LENGTHS[:-1], (32, 768, 1000, 4096, 8192, 16384)):
        for residual, bias in itertools.product((False, True), (False, True)):
            _assert_tpu_ok(check_lowering.norm_calls(rows, dim, dtype, residual=residual, bias=bias), (rows, dim))
    for rows, vocab in itertools.product(LENGTHS[:-1], (2, 1000, 32000, 128256, 151936, 262144)):
        _assert_tpu_ok(check_lowering.cross_entropy_calls(rows, vocab, dtype), (rows, vocab))
    for cache, head_dim, (heads, kv_heads) in itertools.product(LENGTHS, (64, 128, 256), ((8, 8), (32, 4), (16, 1))):
        _assert_tpu_ok(check_lowering.decode_calls((4, heads, head_dim), (4, kv_heads, cache, head_dim), dtype), cache)


def test_blocks_are_frozen_and_overridable():
    assert tuning.blocks("attention", "tpu", 4096, 4096, 128, 2) == tuning.AttentionBlocks(1024, 1024)  # bf16
    assert tuning.blocks("attention", "tpu", 1024, 1024, 128, 2) == tuning.AttentionBlocks(512, 512)
    blocks = tuning.blocks("attention", "tpu", 4096, 4096, 128)  # float32
    assert blocks == tuning.AttentionBlocks(512, 512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        blocks.block_q = 64
    with tuning.override("attention", block_k=256):
        assert tuning.blocks("attention", "tpu", 4096, 4096, 128) == tuning.AttentionBlocks(512, 256)
    assert tuning.blocks("attention", "tpu", 4096, 4096, 128).block_k == 512
    with pytest.raises(KeyError, match="no tuning rule"):
        tuning.blocks("conv", "tpu", 1)


def test_layout_rule_names_the_operand():
    bad = [tpu.Block("logsumexp", (1, 8, 4096), (None, None, 128), "float32")]
    assert tpu.violations(bad, "v5e") == [
        "logsumexp: block (None, None, 128) over array (1, 8, 4096) breaks the (8, 128) rule"
    ]
    assert tpu.rejection(bad, "v5e").startswith("layout: logsumexp")
