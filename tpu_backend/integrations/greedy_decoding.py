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
(a static cache), stopping by length and end-of-sequence tokens only, with no logits
processor or only those the step applies itself (`Processing`: `min_length`,
`min_new_tokens` and `repetition_penalty`, which read the sequence only through its length,
known on the host, and the set of tokens seen, kept on the device): the tokens and the
step's logits and scores (`output_logits`, `output_scores`) are transformers' own. Anything
else (sampling, whose draws come from torch's host generator; beam search; other
processors or stopping criteria) keeps transformers' loop.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Processing:
    """The logits processors the compiled step applies: end-of-sequence tokens (`eos`)
    suppressed while the sequence is shorter than `min_length` (transformers'
    `MinLengthLogitsProcessor`, and `MinNewTokensLengthLogitsProcessor` as prompt + its
    minimum), and `RepetitionPenaltyLogitsProcessor`'s `penalty` on every token seen (the
    prompt's and those generated: a (batch, vocabulary) mask on the device)."""

    min_length: int = 0
    eos: tuple = ()
    penalty: float | None = None

    @classmethod
    def of(cls, logits_processor) -> "Processing | None":
        """What the processors do, or None when one is not among those above."""
        from transformers.generation import logits_process as lp

        min_length, eos, penalty = 0, set(), None
        for processor in logits_processor:
            if isinstance(processor, (lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor)):
                if isinstance(processor, lp.MinLengthLogitsProcessor):
                    length = processor.min_length
                else:
                    length = processor.prompt_length_to_skip + processor.min_new_tokens
                min_length = max(min_length, length)
                eos |= {int(t) for t in torch.as_tensor(processor.eos_token_id).reshape(-1).tolist()}
            elif type(processor) is lp.RepetitionPenaltyLogitsProcessor and processor.prompt_ignore_length is None:
                if penalty is not None:
                    return None
                penalty = float(processor.penalty)
            else:
                return None
        return cls(min_length, tuple(sorted(eos)), penalty)

    def suppresses(self, length: int) -> bool:
        """Whether the token chosen after a sequence of `length` tokens may not end it."""
        return bool(self.eos) and length < self.min_length

    def host_state(self, input_ids: torch.Tensor, vocab: int) -> list[torch.Tensor]:
        """(suppressed, seen, penalty) of `processed_scores` for a call, on the host: the
        end-of-sequence tokens' mask, the prompt's tokens (for a penalty) and the penalty."""
        suppressed = torch.zeros(vocab, dtype=torch.bool)
        suppressed[list(self.eos)] = True
        seen = torch.zeros(input_ids.shape[0], vocab, dtype=torch.bool)
        if self.penalty is not None:
            seen.scatter_(1, input_ids.cpu(), True)
        return [suppressed, seen, torch.tensor(self.penalty or 1.0, dtype=torch.float32)]


def processed_scores(logits, penalty, suppress: bool, suppressed, seen):
    """transformers' processors on one step's logits (float32, (batch, vocabulary)): the
    repetition `penalty` (a 0-d tensor, 1 without one) on the `seen` tokens ((batch,
    vocabulary) mask), and where `suppress`, the `suppressed` tokens ((vocabulary,) mask of
    the end-of-sequence ones) at -inf. Tensors, not Python values: the compiled step keeps
    one program for every call's processors (Dynamo would specialise on each value)."""
    scores = torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)
    return scores.masked_fill(suppressed, -math.inf) if suppress else scores


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
        and Processing.of(logits_processor) is not None
        and model.get_output_embeddings() is not None
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
    """The model's forward, the processors and the token choice as one compiled program:
    `decode_step(unfinished, pad, eos, model_inputs, penalty, suppress, suppressed, seen)`
    -> (tokens, unfinished, logits, scores, seen with the tokens). `suppress` is a Python
    bool (two programs: before and after a minimum length)."""

    def make():
        def decode_step(unfinished, pad, eos, model_inputs, penalty, suppress, suppressed, seen):
            logits = model(**model_inputs, return_dict=True).logits[:, -1].float()
            scores = processed_scores(logits, penalty, suppress, suppressed, seen)
            tokens, unfinished = choose_next_tokens(scores, unfinished, pad, eos)
            return tokens[:, None], unfinished, logits, scores, seen.scatter(1, tokens[:, None], True)

        return decode_step

    return compiled_for(model, "_tpu_decode_step", compile_config, make)


def greedy_search(model, input_ids, logits_processor, stopping_criteria, generation_config, streamer, model_kwargs):
    """transformers' `_sample` for greedy decoding (`applies`), its tokens chosen on the device."""
    from transformers.generation.utils import ALL_CACHE_NAMES, GenerateDecoderOnlyOutput

    from tpu_backend import tensor as device_tensor

    config = generation_config
    processing = Processing.of(logits_processor)
    eos = next((criterion.eos_token_id for criterion in stopping_criteria if hasattr(criterion, "eos_token_id")), None)
    pad = config._pad_token_tensor
    if eos is not None and pad is None:
        raise ValueError("generate() with an end-of-sequence token needs `pad_token_id` to pad finished rows")
    state = processing.host_state(input_ids, model.get_output_embeddings().weight.shape[0])
    stopping = [pad.cpu(), eos.cpu()] if eos is not None else []
    *stopping, suppressed, seen, penalty = device_tensor.cpu_tensors_to_device(stopping + state)  # one transfer
    pad_on_device, eos_on_device = stopping or (None, None)
    compiled_step = _decode_step(model, config.compile_config or model._default_compile_config())
    batch = input_ids.shape[0]

    def step(inputs, length: int):
        """The compiled step after a sequence of `length` tokens."""
        suppress = processing.suppresses(length)
        return compiled_step(unfinished, pad_on_device, eos_on_device, inputs, penalty, suppress, suppressed, seen)

    with model._optimize_model_for_decode():
        unfinished = torch.ones(batch, dtype=torch.bool, device=model.device)
        first = None
        if prompt_steps.applies(model, input_ids, model_kwargs):  # (a short prompt compiles nothing)
            first = prompt_steps.feed(model, lambda inputs: step(inputs, input_ids.shape[1]), input_ids, model_kwargs)
        if first is not None:
            tokens, unfinished, logits, scores, seen = first
            model_kwargs = model._update_model_kwargs_for_generation({}, model_kwargs)
        else:
            outputs = model._prefill(input_ids, config, model_kwargs, is_first_iteration=True)
            model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs)
            logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
            del outputs
            suppress = processing.suppresses(input_ids.shape[1])
            scores = processed_scores(logits, penalty, suppress, suppressed, seen)
            tokens, unfinished = choose_next_tokens(scores, unfinished, pad_on_device, eos_on_device)
            tokens = tokens[:, None]
            seen = seen.scatter(1, tokens, True)

        cache = next((model_kwargs[name] for name in ALL_CACHE_NAMES if name in model_kwargs), None)
        cache_returned = config.return_dict_in_generate or getattr(cache, "_is_user_defined", False)
        # A step launched past the end writes one more cache position: a returned cache is cropped
        # back, and one that cannot be waits for each token instead (transformers' rule).
        read_late = cache is None or cache.is_croppable or not cache_returned

        sequences, unfinished_on_host = input_ids, torch.ones(batch, dtype=torch.bool)
        in_flight, step_logits, step_scores = deque(), [], []
        keep_logits = config.return_dict_in_generate and (config.output_scores or config.output_logits)

        def launch(tokens, logits, scores):
            device_tensor.start_copy_to_host(tokens)
            in_flight.append(tokens)
            if keep_logits:  # (each step's are (batch, vocabulary) float32 on the chip)
                step_logits.append(logits)
                step_scores.append(scores)

        def land():
            """Read the oldest token in flight and append it (as transformers' loop does)."""
            nonlocal sequences, unfinished_on_host
            landed = in_flight.popleft().cpu()
            sequences = torch.cat([sequences, landed], dim=-1)
            if streamer is not None:
                streamer.put(landed[:, 0])
            if eos is not None:
                unfinished_on_host &= ~torch.isin(landed[:, 0], eos)

        launch(tokens, logits, scores)
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
            tokens, unfinished, logits, scores, seen = step(model_inputs, sequences.shape[1] + len(in_flight))
            model_kwargs = model._update_model_kwargs_for_generation({}, model_kwargs)
            launch(tokens, logits, scores)
            while len(in_flight) > 1:
                land()
            if not unfinished_on_host.any():
                past_the_end = True  # the step just launched follows the last token
                break
        if past_the_end:
            in_flight.clear()
            if keep_logits:
                step_logits.pop(), step_scores.pop()
            if cache_returned:
                cache.crop(-1)
        while in_flight:
            land()

    if streamer is not None:
        streamer.end()
    if not config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=tuple(step_scores) if config.output_scores else None,
        logits=tuple(step_logits) if config.output_logits else None,
        cache=cache,
    )
