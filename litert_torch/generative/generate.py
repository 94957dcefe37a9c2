"""Greedy generation: through an exported model in LiteRT, and in PyTorch for reference.

`generate` runs the `prefill` signature over the prompt in chunks of `prefill_len`
tokens (the last chunk padded; padded slots are overwritten or masked later), then the
`decode` signature once per new token, carrying the KV cache from outputs to inputs.
"""

from __future__ import annotations

import numpy as np
import torch

from litert_torch.edge_model import EdgeModel


def _prompt(prompt_ids) -> np.ndarray:
    ids = prompt_ids.detach().cpu().numpy() if isinstance(prompt_ids, torch.Tensor) else np.asarray(prompt_ids)
    ids = ids.reshape(-1).astype(np.int32)
    if ids.size == 0:
        raise ValueError("the prompt is empty: pass at least one token id")
    return ids


def generate(edge_model: EdgeModel, prompt_ids, max_new_tokens: int) -> list[int]:
    """Greedy continuation of `prompt_ids` (a 1-D sequence) with a model from
    `export_generative`; returns the `max_new_tokens` new token ids."""
    prompt = _prompt(prompt_ids)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0:
        return []
    runtime = edge_model.runtime
    runtime.signature("decode")  # a KeyError naming the model's signatures if it is not generative
    prefill = runtime.signature("prefill")
    chunk = prefill.inputs[0].shape[1]
    cache_len = prefill.inputs[2].shape[2]
    if len(prompt) + max_new_tokens > cache_len:
        raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"exported cache length ({cache_len}); export with a larger cache_len")
    padded_len = -(-len(prompt) // chunk) * chunk
    if padded_len > cache_len:
        raise ValueError(f"the prompt padded to whole prefill chunks ({padded_len} tokens) exceeds the "
                         f"exported cache length ({cache_len}); export with a larger cache_len")
    cache = [np.zeros(spec.shape, spec.dtype) for spec in prefill.inputs[2:]]
    for start in range(0, len(prompt), chunk):
        part = prompt[start:start + chunk]
        tokens = np.zeros((1, chunk), np.int32)
        tokens[0, :len(part)] = part
        # Padding fills the next slots; decode overwrites each one before attending to it.
        positions = np.arange(start, start + chunk, dtype=np.int32)
        logits, *cache = runtime.run([tokens, positions, *cache], "prefill")
    last = len(prompt) - 1 - (padded_len - chunk)
    next_token = int(np.argmax(logits[0, last]))
    out = [next_token]
    for pos in range(len(prompt), len(prompt) + max_new_tokens - 1):
        logits, *cache = runtime.run(
            [np.array([[next_token]], np.int32), np.array([pos], np.int32), *cache], "decode")
        next_token = int(np.argmax(logits[0, -1]))
        out.append(next_token)
    return out


@torch.no_grad()
def reference_generate(model: torch.nn.Module, prompt_ids, max_new_tokens: int) -> list[int]:
    """Greedy continuation in PyTorch without a cache (the whole sequence each step):
    the reference `generate` must match. Accepts TinyLlama and transformers models."""
    ids = torch.as_tensor(_prompt(prompt_ids), dtype=torch.long)[None]
    device = next(model.parameters()).device
    out = []
    for _ in range(max_new_tokens):
        result = model(ids.to(device))
        logits = getattr(result, "logits", result)
        next_token = int(logits[0, -1].argmax())
        out.append(next_token)
        ids = torch.cat([ids, torch.tensor([[next_token]])], dim=1)
    return out
