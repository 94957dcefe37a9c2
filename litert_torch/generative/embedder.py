"""Sentence embedders: a transformers encoder (or decoder) body, pooled and normalised, as
one LiteRT signature with a dynamic batch and sequence length.

    edge = export_embedder(BertModel(config), pooling="mean", normalize=True, max_len=128)
    vectors = embed(edge, [[101, 7, 9, 102], [101, 5, 102]])   # ragged ids, padded here

The file has one signature:

    embed(input_ids int32[batch, seq], attention_mask int32[batch, seq]) -> embeddings float32[batch, dim]

with `batch` in [1, max_batch] and `seq` in [1, max_len] (LiteRT resizes the inputs per
call). The model runs its own `forward(input_ids=, attention_mask=)`: embeddings, masks
(padding, bidirectional or sliding windows), attention and norms are transformers' code,
and the exported graph is what torch.export captures of it. On top of its
`last_hidden_state`: pooling ("mean" over the tokens the mask keeps, or "cls": the first
token), an optional `head` (a module on the pooled vector, e.g. EmbeddingGemma's dense
projections) and L2 normalisation.

Exact or refused, before anything is written (`verify_embedder`, `UnsupportedModelError`
with the numbers): a padded batch must give each row's embedding as the model computes it
for that row alone without padding (a model whose attention ignores `attention_mask`
fails here), and the converted file must give the PyTorch embeddings at several batch
sizes and lengths. With a `quant_config` the file's error is measured and kept on the
EdgeModel (`edge.embedder_error`), not refused: it is what quantizing costs.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from litert_torch.edge_model import EdgeModel
from litert_torch.generative.transformers_lm import UnsupportedModelError
from litert_torch.signatures import signature

POOLINGS = ("mean", "cls")
TOLERANCE = 1e-4


class SentenceEmbedder(nn.Module):
    """`forward(input_ids, attention_mask) -> embeddings (batch, dim)`: the model's own
    forward, then pooling, the optional head and normalisation."""

    def __init__(self, model: nn.Module, pooling: str = "mean", normalize: bool = True, head: nn.Module | None = None):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if head is not None and not isinstance(head, nn.Module):
            raise TypeError(f"head must be a torch.nn.Module (applied to the pooled vector), got {type(head).__name__}")
        check_embedder(model)
        self.model, self.pooling, self.normalize, self.head = model, pooling, bool(normalize), head
        params = set(inspect.signature(model.forward).parameters)
        # decoder bodies (Gemma 3 text) would otherwise build a cache they never use
        self._extra = {"use_cache": False} if "use_cache" in params else {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, **self._extra)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            keep = attention_mask.to(hidden.dtype)[..., None]
            pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        if self.head is not None:
            pooled = self.head(pooled)
        if self.normalize:
            pooled = pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        return pooled


def check_embedder(model: nn.Module) -> None:
    """Refuse, by name, what cannot be a sentence embedder here."""
    name = type(model).__name__
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise TypeError(f"{name} is not a transformers model (no .config); pass e.g. BertModel, ModernBertModel")
    if getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name}: an encoder-decoder model; pass its encoder (model.get_encoder()) as the embedder"
        )
    if "attention_mask" not in inspect.signature(model.forward).parameters:
        raise UnsupportedModelError(f"{name}: its forward takes no attention_mask, so padding cannot be masked")


def _max_positions(model: nn.Module) -> int | None:
    cfg = model.config
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


def _vocab(model: nn.Module) -> int:
    cfg = model.config
    return getattr(cfg, "vocab_size", None) or cfg.get_text_config().vocab_size


def verification_batch(vocab: int, lengths: Sequence[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (batch, max(lengths)) padded with 0 at the end, and their mask."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.int32)
    mask = torch.zeros(len(lengths), width, dtype=torch.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(1, vocab, (n,), generator=gen, dtype=torch.int32)
        mask[row, :n] = 1
    return ids, mask


@torch.no_grad()
def verify_embedder(embedder: SentenceEmbedder, lengths: Sequence[int], tolerance: float = TOLERANCE) -> float:
    """A padded batch of `lengths` against each row run alone without padding, through the
    model's own forward: max relative error; UnsupportedModelError above `tolerance`."""
    from runtimes.litert import max_relative_error

    ids, mask = verification_batch(_vocab(embedder.model), lengths)
    batched = embedder(ids, mask)
    alone = torch.cat([embedder(ids[i : i + 1, :n], mask[i : i + 1, :n]) for i, n in enumerate(lengths)])
    error = max_relative_error(batched.numpy(), alone.numpy())
    if not error <= tolerance:
        raise UnsupportedModelError(
            f"{type(embedder.model).__name__}: padding changes the embeddings by {error:.3g} (max relative, "
            f"lengths {list(lengths)} padded to {max(lengths)} against each alone): the model does not mask "
            "padded tokens through attention_mask; refusing to export a different model"
        )
    return error


def export_embedder(
    model: nn.Module,
    *,
    pooling: str = "mean",
    normalize: bool = True,
    max_len: int | None = None,
    max_batch: int = 16,
    head: nn.Module | None = None,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    **convert_options,
) -> EdgeModel:
    """Convert `model` (a transformers model returning `last_hidden_state`: BertModel,
    ModernBertModel, Gemma3TextModel with `use_bidirectional_attention=True`,
    EmbeddingGemma2TextModel, ...) into a LiteRT model with the one signature `embed`
    (see the module docstring). `max_len`: the longest sequence the file accepts (default:
    the model's position limit, at most 512); `max_batch`: the largest batch. `head`: a
    module applied to the pooled vector before normalising. `verify`: the padding check in
    PyTorch and the file against PyTorch (refused above `tolerance`, max relative error;
    a quantized file's error is only measured: `edge.embedder_error`). `convert_options`
    go to `convert` (quant_config, target, progress...)."""
    from converter.pipeline import cpu_view
    from runtimes.litert import max_relative_error

    embedder = SentenceEmbedder(cpu_view(model), pooling, normalize, head).eval()
    limit = _max_positions(embedder.model)
    if max_len is None:
        max_len = min(limit or 512, 512)
    if not isinstance(max_len, int) or max_len < 2:
        raise ValueError(f"max_len must be an int >= 2, got {max_len!r}")
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len ({max_len}) exceeds the model's max_position_embeddings ({limit})")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    # a padded batch (lengths differ, one row full) and a single short row
    lengths = [min(max_len, 12), max(1, min(max_len, 12) - 5), 2][: max(max_batch, 1)]
    if verify:
        verify_embedder(embedder, lengths, tolerance)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    seq = torch.export.Dim("seq", min=1, max=max_len)
    sample = verification_batch(_vocab(embedder.model), [max_len // 2 + 1, 2] if max_batch > 1 else [max_len // 2 + 1])
    edge = signature(
        "embed",
        embedder,
        sample,
        dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
        output_names=["embeddings"],
    ).convert(signature_name="embed", **convert_options)
    edge.embedder_error = None
    if verify:
        errors = []
        for shape in (lengths, [min(max_len, 5)]):
            ids, mask = verification_batch(_vocab(embedder.model), shape, seed=1)
            with torch.no_grad():
                expected = embedder(ids, mask).numpy()
            errors.append(max_relative_error(edge(ids.numpy(), mask.numpy()), expected))
        edge.embedder_error = max(errors)
        if convert_options.get("quant_config") is None and not edge.embedder_error <= tolerance:
            raise UnsupportedModelError(
                f"{type(model).__name__}: the LiteRT file's embeddings differ from PyTorch's by "
                f"{edge.embedder_error:.3g} (max relative); refusing to return a different model"
            )
    return edge


def pad_batch(sequences, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ragged token ids -> (ids int32[batch, longest], attention_mask int32[batch, longest]),
    padded at the end with `pad_id`."""
    rows = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
    if not rows or any(r.size == 0 for r in rows):
        raise ValueError("sequences must be a non-empty list of non-empty token id sequences")
    width = max(r.size for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        ids[i, : r.size], mask[i, : r.size] = r, 1
    return ids, mask


def embed(edge: EdgeModel, sequences, attention_mask=None) -> np.ndarray:
    """Embeddings (batch, dim) from a model of `export_embedder`: `sequences` is either a
    list of token id lists (padded here) or an id array (batch, seq) with its
    `attention_mask`."""
    if attention_mask is None:
        ids, mask = pad_batch(sequences)
    else:
        ids = np.asarray(sequences, dtype=np.int32)
        mask = np.asarray(attention_mask, dtype=np.int32)
        if ids.ndim != 2 or mask.shape != ids.shape:
            raise ValueError(
                f"input_ids must be (batch, seq) and attention_mask the same shape; got {ids.shape} and {mask.shape}"
            )
    return edge(ids, mask, signature_name="embed")
