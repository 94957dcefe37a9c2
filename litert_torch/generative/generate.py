"""Generation through an exported model in LiteRT, and in PyTorch for reference.

`generate` runs the prompt through the prefill signature(s) in chunks (the smallest
`prefill_<n>` that holds the rest of the prompt, else the largest; the last chunk padded
at the end with position -1), then `decode` once per new token, carrying the KV cache
from outputs to inputs. Positions follow the export's contract (consecutive from the
chunk's first, `kv_cache.check_positions`): a last chunk that would run past the cache
starts earlier instead, computing a few prompt tokens again (models with sliding-window
ring buffers run those tokens through `decode` instead). When the prefill does not
return the logits of the last prompt token (prefill_logits "none", or "last" with a
padded chunk), that token goes through `decode` instead.

Tokens are greedy by default; `temperature` > 0 samples, optionally restricted to the
`top_k` most likely tokens and to the smallest set whose probability reaches `top_p`,
from a NumPy generator seeded with `seed`. Generation stops after a token in
`stop_tokens` (which is returned).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from litert_torch.edge_model import EdgeModel
from litert_torch.generative.kv_cache import check_positions


def one_example(value, rank: int, name: str) -> np.ndarray:
    """`value` as one example of `rank` dimensions (a leading batch of one dropped). A batch
    of several is refused: run together into one example it would give one result for the
    rows joined, silently not what was asked."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    while array.ndim > rank and array.shape[0] == 1:
        array = array[0]
    if array.ndim > rank:
        raise ValueError(
            f"{name} has shape {tuple(array.shape)}: this call takes one example ({rank}-D, or a batch of one); "
            f"pass each of the {array.shape[0]} rows ({name}[i]) in a call of its own"
        )
    return array


def one_sequence(ids, name: str = "prompt_ids") -> np.ndarray:
    """Token ids of one sequence (1-D, or a batch of one row) as int32 (`one_example`)."""
    array = one_example(ids, 1, name)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integer token ids, got {array.dtype}")
    array = array.reshape(-1)
    if array.size == 0:
        raise ValueError(f"{name} is empty: pass at least one token id")
    if array.min() < 0:
        raise ValueError(f"{name} holds a negative token id ({int(array.min())})")
    if array.max() > np.iinfo(np.int32).max:
        raise ValueError(f"{name} holds token id {int(array.max())}, beyond the int32 ids a model takes")
    return array.astype(np.int32)


def check_vocabulary(ids: np.ndarray, vocab_size: int, name: str = "prompt_ids") -> None:
    """Every id in [0, vocab_size): LiteRT's GATHER fails on one outside with a message that
    names neither the id nor the vocabulary."""
    outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if outside.size:
        raise ValueError(
            f"{name} holds token id {int(ids[outside[0]])} (at position {int(outside[0])}), outside the "
            f"model's vocabulary of {vocab_size} ids (0 to {vocab_size - 1})"
        )


def logits_vocabulary(signature_runner) -> int:
    """The vocabulary size a signature's first output (its logits) spans."""
    return int(signature_runner.outputs[0].shape[-1])


@dataclass(frozen=True)
class Sampler:
    """Picks the next token from one row of logits; greedy when temperature is 0."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def __call__(self, logits, rng: np.random.Generator) -> int:
        logits = np.asarray(logits, dtype=np.float64).reshape(-1)
        if self.temperature == 0:
            return int(np.argmax(logits))
        order = np.argsort(-logits, kind="stable")
        if self.top_k is not None:
            order = order[: self.top_k]
        scaled = logits[order] / self.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if self.top_p is not None:
            # keep the most likely tokens until their mass reaches top_p (at least one)
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return int(order[rng.choice(len(order), p=probs)])


def _sampler(temperature, top_k, top_p, seed) -> Sampler:
    return Sampler(float(temperature or 0.0), top_k, top_p, seed)


@dataclass(frozen=True)
class LogitsRules:
    """The logits processors of transformers' `generate` that a LiteRT loop applies, in its
    order (before sampling): the repetition penalty over the sequence so far, no n-gram of
    `no_repeat_ngram` tokens twice in the sequence and none of `encoder_no_repeat_ngram`
    tokens of the encoder's input ids, no end token before `min_new` new tokens, a forced first token (`forced_bos`, when the sequence is one
    token long) and a forced end at the last step (`forced_eos`), tokens never picked
    (`suppress`) and not picked first (`begin_suppress`). Ids beyond the vocabulary are
    ignored, as transformers' masks ignore them."""

    eos: tuple[int, ...] = ()
    min_new: int = 0
    repetition_penalty: float | None = None
    no_repeat_ngram: int | None = None
    encoder_no_repeat_ngram: int | None = None
    forced_bos: int | None = None
    forced_eos: int | None = None
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()


class Picker:
    """A `Sampler` behind `LogitsRules`, for one generated sequence: it counts its picks and
    keeps the sequence (`context`, the prompt first) that the rules read, and, when asked
    (`keep_logits`, `keep_scores`: a vocabulary of floats per step), every step's logits as
    they came (`logits`) and as the rules left them (`scores`); `on_pick(token)` hears each
    token as it is picked. Pass it as `sampler=` to the generate functions, which call it once
    per new token."""

    def __init__(
        self,
        sampler: Sampler,
        rules: LogitsRules,
        context,
        max_new_tokens: int,
        encoder_ids=None,
        on_pick=None,
        *,
        keep_logits: bool = False,
        keep_scores: bool = False,
    ):
        self.sampler, self.rules, self.max_new_tokens, self.on_pick = sampler, rules, max_new_tokens, on_pick
        self.keep_logits, self.keep_scores = keep_logits, keep_scores
        self.context = [int(t) for t in np.asarray(context).reshape(-1)]
        self.encoder_ids = None if encoder_ids is None else [int(t) for t in np.asarray(encoder_ids).reshape(-1)]
        if rules.encoder_no_repeat_ngram and self.encoder_ids is None:
            raise ValueError("encoder_no_repeat_ngram_size needs an encoder's input ids (an encoder-decoder's source)")
        self.picked, self.logits, self.scores = 0, [], []

    def rng(self) -> np.random.Generator:
        return self.sampler.rng()

    def __call__(self, logits, rng: np.random.Generator) -> int:
        rules, scores = self.rules, np.array(logits, dtype=np.float32).reshape(-1)
        if self.keep_logits:
            self.logits.append(scores.copy())
        vocab = lambda ids: [i for i in ids if 0 <= i < scores.size]  # noqa: E731
        if rules.repetition_penalty not in (None, 1.0):
            seen = np.array(sorted(set(vocab(self.context))), dtype=np.int64)
            picked = scores[seen]
            scores[seen] = np.where(picked < 0, picked * rules.repetition_penalty, picked / rules.repetition_penalty)
        if rules.no_repeat_ngram:
            scores[vocab(_completing(self.context, self.context, rules.no_repeat_ngram))] = -np.inf
        if rules.encoder_no_repeat_ngram:
            scores[vocab(_completing(self.encoder_ids, self.context, rules.encoder_no_repeat_ngram))] = -np.inf
        if self.picked < rules.min_new:
            scores[vocab(rules.eos)] = -np.inf
        if rules.forced_bos is not None and len(self.context) == 1:
            scores[:] = -np.inf
            scores[rules.forced_bos] = 0
        if rules.forced_eos is not None and self.picked == self.max_new_tokens - 1:
            scores[:] = -np.inf
            scores[rules.forced_eos] = 0
        scores[vocab(rules.suppress)] = -np.inf
        if self.picked == 0:
            scores[vocab(rules.begin_suppress)] = -np.inf
        if self.keep_scores:
            self.scores.append(scores)
        token = self.sampler(scores, rng)
        self.picked += 1
        self.context.append(token)
        if self.on_pick is not None:  # a streamer's put
            self.on_pick(token)
        return token


def _completing(source: list[int], sequence: list[int], n: int) -> list[int]:
    """The tokens that would end an n-gram of `source` after the last n - 1 tokens of
    `sequence` (transformers' n-gram blocking: nothing while the sequence is shorter)."""
    if len(sequence) + 1 < n:
        return []
    last = tuple(sequence[len(sequence) - n + 1 :]) if n > 1 else ()
    return [source[i + n - 1] for i in range(len(source) - n + 1) if tuple(source[i : i + n - 1]) == last]


def _prefill_signatures(runtime) -> dict[int, str]:
    """Chunk length -> signature key for `prefill` or `prefill_<n>`."""
    out = {}
    for sig in runtime.signatures:
        if sig.key == "prefill" or sig.key.startswith("prefill_"):
            out[sig.inputs[0].shape[1]] = sig.key
    if not out:
        raise KeyError(f"the model has no prefill signature; it has {[s.key for s in runtime.signatures]}")
    return dict(sorted(out.items()))


def _plan_chunks(n_tokens: int, lengths: list[int], cache_len: int | None, redo: bool) -> list[tuple[int, int]]:
    """(start, size) of the prefill calls over tokens [0, n_tokens): the smallest length
    holding the rest, else the largest. A chunk that would run past a linear cache of
    `cache_len` slots (None: no bound) ends at n_tokens instead, redoing earlier tokens,
    when `redo`; else (ring buffers, which hold the positions before a chunk, would see the
    redone ones twice) the plan stops there and the rest goes through decode."""
    plan, done = [], 0
    while done < n_tokens:
        rest = n_tokens - done
        size = next((n for n in lengths if n >= rest), lengths[-1])
        start = done
        if cache_len is not None and done + size > cache_len:
            if not redo:
                break
            start = n_tokens - size
        plan.append((start, size))
        done = min(start + size, n_tokens)
    return plan


def generate(
    edge_model: EdgeModel,
    prompt_ids,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens=(),
    return_logits: bool = False,
    sampler: Sampler | Picker | None = None,
):
    """Continuation of `prompt_ids` (one sequence: 1-D, or a batch of one row) with a model
    from `export_generative`; returns up to `max_new_tokens` new token ids (fewer when a stop
    token comes). Greedy unless `temperature` > 0 (see the module docstring); `sampler`: a
    `Sampler` or `Picker` in place of those arguments. With `return_logits`, also the logits
    row each new token was picked from."""
    prompt = one_sequence(prompt_ids)
    sampler = sampler or _sampler(temperature, top_k, top_p, seed)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0:
        return ([], []) if return_logits else []
    stop = {int(t) for t in stop_tokens}
    runtime = edge_model.runtime
    decode = runtime.signature("decode")  # a KeyError naming the model's signatures if it is not generative
    check_vocabulary(prompt, logits_vocabulary(decode))
    prefills = _prefill_signatures(runtime)
    lengths = list(prefills)
    # Linear caches bound the context; ring buffers (kv_ring_*) do not.
    cache_len = max((spec.shape[2] for spec in decode.outputs[1:] if spec.name.startswith("kv_cache")), default=None)
    if cache_len is not None and len(prompt) + max_new_tokens > cache_len:
        raise ValueError(
            f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"exported cache length ({cache_len}); export with a larger cache_len"
        )
    redo = not any(spec.name.startswith("kv_ring") for spec in decode.outputs)
    first = runtime.signature(prefills[lengths[0]])
    has_logits = first.output_names[0] == "logits"
    all_logits = has_logits and first.outputs[0].shape[1] == lengths[0] > 1
    start, size = _plan_chunks(len(prompt), lengths, cache_len, redo)[-1]
    # Prefill the whole prompt when its logits come back for the last token, else all but it.
    whole = all_logits or (has_logits and start + size == len(prompt))
    n_prefill = len(prompt) if whole else len(prompt) - 1
    cache = [np.zeros(spec.shape, spec.dtype) for spec in decode.inputs[2:]]
    logits_row, prefilled = None, 0
    for start, size in _plan_chunks(n_prefill, lengths, cache_len, redo):
        part = prompt[:n_prefill][start : start + size]
        tokens = np.zeros((1, size), np.int32)
        tokens[0, : len(part)] = part
        positions = np.full(size, -1, np.int32)
        positions[: len(part)] = np.arange(start, start + len(part))
        check_positions(positions, cache_len)
        logits, *cache = _split(runtime.run([tokens, positions, *cache], prefills[size]), has_logits)
        if logits is not None:
            logits_row = logits[0, len(part) - 1] if all_logits else logits[0, -1]
        prefilled = start + len(part)
    for pos in range(prefilled, len(prompt)):  # the last prompt token, or the tail no chunk could take
        logits, *cache = runtime.run([prompt[None, pos : pos + 1], np.array([pos], np.int32), *cache], "decode")
        logits_row = logits[0, -1]
    rng = sampler.rng()
    rows = [logits_row]
    out = [sampler(logits_row, rng)]
    for pos in range(len(prompt), len(prompt) + max_new_tokens - 1):
        if out[-1] in stop:
            break
        logits, *cache = runtime.run([np.array([[out[-1]]], np.int32), np.array([pos], np.int32), *cache], "decode")
        rows.append(logits[0, -1])
        out.append(sampler(rows[-1], rng))
    return (out, rows) if return_logits else out


def _split(outputs: list, has_logits: bool):
    return outputs if has_logits else [None, *outputs]


@torch.no_grad()
def reference_generate(
    model: torch.nn.Module,
    prompt_ids,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_tokens=(),
    return_logits: bool = False,
):
    """The same continuation in PyTorch without a cache (the whole sequence each step):
    the reference `generate` must match. Accepts TinyLlama and transformers models.
    With `return_logits`, also the logits row of every new token (float32 NumPy)."""
    sampler = _sampler(temperature, top_k, top_p, seed)
    stop = {int(t) for t in stop_tokens}
    ids = torch.as_tensor(one_sequence(prompt_ids), dtype=torch.long)[None]
    device = next(model.parameters()).device
    rng = sampler.rng()
    out, rows = [], []
    for _ in range(max_new_tokens):
        result = model(ids.to(device))
        logits = getattr(result, "logits", result)
        rows.append(logits[0, -1].float().cpu().numpy())
        out.append(sampler(rows[-1], rng))
        if out[-1] in stop:
            break
        ids = torch.cat([ids, torch.tensor([[out[-1]]])], dim=1)
    return (out, rows) if return_logits else out
