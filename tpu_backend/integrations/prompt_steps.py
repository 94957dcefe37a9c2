"""generate()'s prompt fed through the compiled decode step, one token at a time, and a long
prompt's head in chunks of one size.

On the device transformers' decode step is one compiled program (a static cache), while
the prefill runs eagerly: a prompt length not seen before compiles the prefill's per-op
programs (a 1B Llama on a v5e: 52 programs, 7.8 s of the first call, and again for every
new length, e.g. every turn of a chat). A prompt of up to `MAX_TOKENS` tokens goes
through the decode step instead, as transformers' chunked prefill with chunks of one
token: nothing compiles for it, and a step costs ~4 ms of host (128 tokens: ~0.5 s). A
longer prompt's head goes through the model's forward eagerly in chunks of `CHUNK` tokens,
whose per-op programs have the same shapes for every prompt (the chunk, the static cache):
they compile at the first long prompt and never again; its last 1 to `CHUNK` tokens go
through the decode step. The static cache is allocated first (`early_initialization` with
`_get_static_cache_init_shape`, as transformers does for a compiled prefill), so that the
step's first trace sees the cache it keeps. Used by the device's greedy loop (its step
also picks the token) and by transformers' own loops (sampling, beam search) through the
compiled forward they decode with.
"""

from __future__ import annotations

import torch

MAX_TOKENS = 128
CHUNK = 64

# What a text prompt's prefill may be given besides the cache and the prompt itself.
_TEXT_PROMPT_INPUTS = {"attention_mask", "position_ids", "logits_to_keep", "use_cache", "cache"}


def applies(model, input_ids: torch.Tensor, model_kwargs: dict) -> bool:
    """A text prompt on the host, into a fresh static cache of transformers' own."""
    from transformers.cache_utils import StaticCache, StaticLayer

    cache = model_kwargs.get("cache")
    return (
        input_ids.shape[-1] > 0
        and getattr(model, "_tpu_prompt_steps", True)
        and input_ids.device.type == "cpu"
        and type(cache) is StaticCache
        and not getattr(cache, "_is_user_defined", False)
        and all(type(layer) is StaticLayer and not layer.is_initialized for layer in cache.layers)
        and set(model_kwargs) <= _TEXT_PROMPT_INPUTS
        and model._get_static_cache_init_shape() is not None
    )


def feed(model, step, input_ids: torch.Tensor, model_kwargs: dict):
    """`step(model_inputs)` for each prompt token in turn (after a long prompt's chunks, run
    eagerly); returns the last step's result. Or None, with the cache as it was, where the
    cache's shapes from the config are not the model's (transformers'
    `_get_static_cache_init_shape` gives a multi-query Falcon 4 key/value heads where it
    writes 1: the first write refuses them); the caller then runs the model's own prefill,
    as it will for this model from then on."""
    cache = model_kwargs["cache"]
    num_heads, head_dim = model._get_static_cache_init_shape()
    cache.early_initialization(input_ids.shape[0], num_heads, head_dim, model.dtype, model.device)
    sliced = {key: model_kwargs[key] for key in ("attention_mask", "position_ids") if model_kwargs.get(key) is not None}
    length = input_ids.shape[-1]
    chunked = 0 if length <= MAX_TOKENS else (length - 1) // CHUNK * CHUNK
    start = 0
    for end in [*range(CHUNK, chunked + 1, CHUNK), *range(chunked + 1, length + 1)]:
        kwargs = {**model_kwargs, **{key: value[..., :end] for key, value in sliced.items()}}
        model_inputs = model.prepare_inputs_for_generation(
            input_ids[:, :end], next_sequence_length=end - start, **kwargs
        )
        try:
            result = step(model_inputs) if end - start == 1 else model(**model_inputs, return_dict=True)
        except RuntimeError:  # (torch._dynamo's TorchRuntimeError too)
            if start > 0:
                raise
            for layer in cache.layers:  # back to StaticLayer's state before its first write
                del layer.keys, layer.values
                layer.is_initialized, layer.cumulative_length = False, torch.tensor(0, dtype=int)
            model._tpu_prompt_steps = False
            return None
        start = end
    return result
