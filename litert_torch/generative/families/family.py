"""The record every generative family fills (`Family`), and what several families share:
processor outputs as arrays, a batch's rows without their padding."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Family:
    """What differs between generative families (`litert_torch.generative.families`).

    convert(model, sample, sizes, options) -> EdgeModel: `sample` the processor outputs,
        `sizes` this family's `sizes` with the caller's values, `options` for `convert`.
    facts(model) -> dict: what generation reads from the model (token ids, sizes), kept so
        that the converted model generates without the PyTorch one.
    rows(inputs, facts) -> [row]: one dict per row of the batch, with `prefix` (the ids the
        output starts with: the padded input_ids for decoders, the decoder prompt for
        encoder-decoders) and what `generate` reads.
    generate(edge, row, max_new_tokens, picker, stop, facts) -> new token ids.
    embed(edge, inputs, facts) -> embeddings (batch, dim).
    """

    name: str
    matches: Callable[[nn.Module], bool]
    inputs: tuple[str, ...]
    convert: Callable
    sizes: dict = field(default_factory=dict)
    facts: Callable[[nn.Module], dict] = lambda model: {}
    rows: Callable | None = None
    generate: Callable | None = None
    embed: Callable | None = None


def as_array(value, name: str, ndim: int | None = None) -> np.ndarray:
    """A processor output (tensor, array or nested list) as a NumPy array of `ndim` dimensions."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if ndim is not None and array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions (batch first), got shape {tuple(array.shape)}")
    return array


def unpadded_rows(inputs: dict, padding_side: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(the row as given, its tokens without padding) for each row of `input_ids`, the padding
    read from `attention_mask` (all ones when absent). Padding on the other side, or inside a
    row, is refused: the exported signatures place a row's tokens from position 0."""
    if "input_ids" not in inputs:
        raise ValueError("pass input_ids (what the tokenizer or processor returns), and its attention_mask")
    ids = as_array(inputs["input_ids"], "input_ids", 2)
    mask = inputs.get("attention_mask")
    mask = np.ones_like(ids) if mask is None else as_array(mask, "attention_mask", 2)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(ids.shape)}: pass one per id")
    rows = []
    for i, (row, keep) in enumerate(zip(ids, mask.astype(bool))):
        kept = np.flatnonzero(keep)
        if kept.size == 0:
            raise ValueError(f"row {i} of attention_mask is all zeros: every row needs a token")
        side = "left" if kept[-1] == len(row) - 1 else "right"
        if kept[-1] - kept[0] + 1 != kept.size or (kept.size < len(row) and side != padding_side):
            raise ValueError(
                f"row {i} of attention_mask is {keep.astype(int).tolist()}: this family takes padding on the "
                f"{padding_side} only (the tokenizer's padding_side={padding_side!r})"
            )
        rows.append((row, row[keep]))
    return rows
