"""Greedy generate() on the device, with the host one token ahead of the chip.

transformers' loop picks each token on the host from the step's logits, so the host
waits for every step before it can prepare the next one, and the chip waits while it
does (on a TPU v5e, a 1B Llama's step is ~3 ms on the chip and ~4 ms on the host). Here
the compiled decode step picks the token itself (argmax, and the padding of finished
rows), the next step takes that token as a device input, and the host reads each token
one step late: while the chip runs step n, the host lands token n-1 and prepares step
n+1. When a token finishes every row, the step launched after it is dropped, as
transformers' own deferred stop check does (its `DeferredStopCheck`, used on "mps").

Taken for greedy decoding of a decoder-only model whose step transformers would compile
(a static cache), with no logits processor and stopping by length and end-of-sequence
tokens only: the tokens, and the step's logits (`output_logits`, `output_scores`), are
transformers' own. Anything else (sampling, whose draws come from torch's host
generator; beam search; other processors or stopping criteria) keeps transformers' loop.
"""

from __future__ import annotations

from collections import deque

import torch

from tpu_backend.integrations import prompt_steps
from tpu_backend.integrations.own_code import compile_own

# False: every greedy call takes transformers' loop (benchmarks compare the two).
ENABLED = True


def choose_next_tokens(logits, unfinished, pad, eos):
    """transformers' greedy choice: the argmax, padding for rows already finished, and
    which rows stay unfinished after this token (an end-of-sequence token finishes one)."""
    tokens = logits.argmax(-1)
    if eos is not None:
        tokens = torch.where(unfinished, tokens, pad)
        unfinished = unfinished & ~torch.isin(tokens, eos)
    return tokens, unfinished


def applies(model, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs) -> bool:
    """Whether this `_sample` call can decode with the device's loop (module docstring)."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    config = generation_config
    return (
        ENABLED
        and not config.do_sample
        and not config.is_assistant
        and not synced_gpus
        and not config.output_attentions
        and not config.output_hidden_states
        and config.prefill_chunk_size is None
        and len(logits_processor) == 0
        and stopping_criteria.max_length is not None
        and all(isinstance(criterion, (MaxLengthCriteria, EosTokenCriteria)) for criterion in stopping_criteria)
        and model._valid_auto_compile_criteria(model_kwargs, generation_config)
    )


def compiled_for(model, attribute: str, compile_config, make):
    """`torch.compile` of the function `make()` builds for `model`, kept on the model under
    `attribute` for later calls with the same config (as transformers keeps its compiled
    forward). The function gets a code object of its own: Dynamo counts recompiles per code
    object, and with one shared by every model, once the models seen in a process passed the
    recompile limit (8), every later model ran eagerly (`own_code`)."""
    cached = getattr(model, attribute, None)
    if cached is None or cached[0] != compile_config:
        cached = (compile_config, compile_own(make(), **compile_config.to_dict()))
        setattr(model, attribute, cached)
    return cached[1]


def _decode_step(model, compile_config):
    """The model's forward and the token choice as one compiled program."""

    def make():
        def decode_step(unfinished, pad, eos, model_inputs):
            logits = model(**model_inputs, return_dict=True).logits[:, -1].float()
            tokens, unfinished = choose_next_tokens(logits, unfinished, pad, eos)
            return tokens[:, None], unfinished, logits

        return decode_step

    return compiled_for(model, "_tpu_decode_step", compile_config, make)


def greedy_search(model, input_ids, stopping_criteria, generation_config, streamer, model_kwargs):
    """transformers' `_sample` for greedy decoding (`applies`), its tokens chosen on the device."""
    from transformers.generation.utils import ALL_CACHE_NAMES, GenerateDecoderOnlyOutput

    from tpu_backend import tensor as device_tensor

    config = generation_config
    eos = next((criterion.eos_token_id for criterion in stopping_criteria if hasattr(criterion, "eos_token_id")), None)
    pad = config._pad_token_tensor
    if eos is not None and pad is None:
        raise ValueError("generate() with an end-of-sequence token needs `pad_token_id` to pad finished rows")
    pad_on_device, eos_on_device = (
        device_tensor.cpu_tensors_to_device([pad.cpu(), eos.cpu()]) if eos is not None else (None, None)
    )
    compile_config = config.compile_config or model._default_compile_config()
    step = _decode_step(model, compile_config)
    batch = input_ids.shape[0]

    with model._optimize_model_for_decode():
        unfinished = torch.ones(batch, dtype=torch.bool, device=model.device)
        first = None
        if prompt_steps.applies(model, input_ids, model_kwargs):  # (a short prompt compiles nothing)
            first = prompt_steps.feed(
                model, lambda inputs: step(unfinished, pad_on_device, eos_on_device, inputs), input_ids, model_kwargs
            )
        if first is not None:
            tokens, unfinished, logits = first
            model_kwargs = model._update_model_kwargs_for_generation({}, model_kwargs)
        else:
            outputs = model._prefill(input_ids, config, model_kwargs, is_first_iteration=True)
            model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs)
            logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
            del outputs
            tokens, unfinished = choose_next_tokens(logits, unfinished, pad_on_device, eos_on_device)
            tokens = tokens[:, None]

        cache = next((model_kwargs[name] for name in ALL_CACHE_NAMES if name in model_kwargs), None)
        cache_returned = config.return_dict_in_generate or getattr(cache, "_is_user_defined", False)
        # A step launched past the end writes one more cache position: a returned cache is cropped
        # back, and one that cannot be waits for each token instead (transformers' rule).
        read_late = cache is None or cache.is_croppable or not cache_returned

        sequences, unfinished_on_host = input_ids, torch.ones(batch, dtype=torch.bool)
        in_flight, step_logits = deque(), []
        keep_logits = config.return_dict_in_generate and (config.output_scores or config.output_logits)

        def launch(tokens, logits):
            device_tensor.start_copy_to_host(tokens)
            in_flight.append(tokens)
            if keep_logits:  # (each step's are (batch, vocabulary) float32 on the chip)
                step_logits.append(logits)

        def land():
            """Read the oldest token in flight and append it (as transformers' loop does)."""
            nonlocal sequences, unfinished_on_host
            landed = in_flight.popleft().cpu()
            sequences = torch.cat([sequences, landed], dim=-1)
            if streamer is not None:
                streamer.put(landed[:, 0])
            if eos is not None:
                unfinished_on_host &= ~torch.isin(landed[:, 0], eos)

        launch(tokens, logits)
        past_the_end = False
        while sequences.shape[1] + len(in_flight) < stopping_criteria.max_length:
            if not read_late:
                while in_flight:
                    land()
                if not unfinished_on_host.any():
                    break
            # The host knows every position and the mask; only the newest token is on the device.
            unknown = sequences.new_zeros((batch, len(in_flight)))
            model_inputs = model.prepare_inputs_for_generation(
                torch.cat([sequences, unknown], dim=-1), next_sequence_length=1, **model_kwargs
            )
            model_inputs["input_ids"] = tokens
            tokens, unfinished, logits = step(unfinished, pad_on_device, eos_on_device, model_inputs)
            model_kwargs = model._update_model_kwargs_for_generation({}, model_kwargs)
            launch(tokens, logits)
            while len(in_flight) > 1:
                land()
            if not unfinished_on_host.any():
                past_the_end = True  # the step just launched follows the last token
                break
        if past_the_end:
            in_flight.clear()
            if keep_logits:
                step_logits.pop()
            if cache_returned:
                cache.crop(-1)
        while in_flight:
            land()

    if streamer is not None:
        streamer.end()
    if not config.return_dict_in_generate:
        return sequences
    kept = tuple(step_logits)
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=kept if config.output_scores else None,
        logits=kept if config.output_logits else None,
        cache=cache,
    )
