"""One call for every generative family, as transformers users write it.

    edge = litert_torch.generative.convert(model, processor(text=..., images=..., return_tensors="pt"))
    ids = edge.generate(**inputs, max_new_tokens=20)        # what model.generate(**inputs) returns
    vectors = embedder.embed(**inputs)                       # sentence and image embedders

`convert` finds the model's family (`families.family_of`), reads the sizes it can from the
sample (the source length of a text or speech encoder-decoder, the image size, the number of
images, Qwen-VL's image grids, Florence-2's task prompt length), takes the others from its
keywords or their defaults (the cache length), and converts with the family's signatures.
`generate` takes the processor's outputs for a batch, resolves the model's
`generation_config` with the call's arguments as transformers does, generates each row in
LiteRT, and returns the ids transformers' `generate` returns: a LongTensor (batch, length),
the prompt (decoders) or the decoder prompt (encoder-decoders) first, rows that ended early
filled with `pad_token_id`. Greedy generation equals transformers' token for token (within
the float error of the logits); sampling draws from the same distribution with NumPy's
generator (`seed=`, else a seed drawn from torch's, so `torch.manual_seed` reproduces a run).
What the LiteRT loop does not apply (beam search, contrastive search, ...) is refused by name.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import torch
from torch import nn

from litert_torch.edge_model import EdgeModel
from litert_torch.generative.errors import UnsupportedModelError
from litert_torch.generative.families import FAMILIES, Family, decoder, family_of
from litert_torch.generative.generate import LogitsRules, Picker, Sampler

# The metadata entry that carries the family, its facts and the generation config (`load`).
METADATA = "litert_torch.generative"
# transformers' defaults where a generation config leaves a field unset
DEFAULT_NEW_TOKENS, DEFAULT_TOP_K = 20, 50
# Fields of a generation config that the LiteRT loop applies (LogitsRules, the sampler, the
# lengths and token ids), and fields that change nothing it returns. Any other field set is
# refused by name.
APPLIED = {
    "max_length", "max_new_tokens", "min_length", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p",
    "repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "suppress_tokens",
    "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "pad_token_id", "bos_token_id",
    "eos_token_id", "decoder_start_token_id", "return_dict_in_generate", "output_logits", "output_scores",
}  # fmt: skip
# Warpers transformers applies only when sampling: set in a greedy call they change nothing.
SAMPLING_ONLY = {"min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h"}
NEUTRAL = {"use_cache", "_from_model_config", "transformers_version"}
NEUTRAL_VALUES = {"num_beams": 1, "num_return_sequences": 1, "output_attentions": False, "output_hidden_states": False}


def convert(
    model: nn.Module,
    inputs=None,
    *,
    verify: bool = True,
    quant_config=None,
    target: str | None = None,
    progress: bool | None = None,
    **sizes,
) -> GenerativeModel:
    """Convert a transformers generative model (or a sentence or image embedder) into LiteRT.
    `inputs`: a sample of what its processor or tokenizer returns (a dict, or a
    `BatchEncoding`), from which sizes are read; `sizes`: the family's sizes that the sample
    does not fix (`cache_len`, `prefill_len`, `source_len`, `pooling`, ... see the error for a
    wrong one). `verify`: the family's check against the model's own forward before
    converting (refuses on a difference). Returns a `GenerativeModel`."""
    family = family_of(model)
    given = {k for k, v in dict(inputs or {}).items() if v is not None}
    media = sorted(given & {"pixel_values", "input_features", "input_values", "pixel_values_videos"})
    if media and family is decoder.FAMILY:
        raise UnsupportedModelError(
            f"{type(model).__name__}: its {', '.join(media)} are not read by a family this package converts "
            "(images: Gemma 3, SmolVLM, Idefics3, PaliGemma, Qwen2-VL, Qwen2.5-VL, image-to-text models; audio: "
            "Whisper, Speech2Text, Moonshine); as a causal LM it converts its text path alone: pass input_ids "
            "and attention_mask"
        )
    sample = _inputs(family, dict(inputs or {}))
    unknown = sorted(set(sizes) - set(family.sizes))
    if unknown:
        raise TypeError(
            f"convert() got {', '.join(unknown)}, which this {family.name} does not take; its sizes are "
            f"{', '.join(family.sizes) or 'none'}"
        )
    config, facts = copy.deepcopy(getattr(model, "generation_config", None)), family.facts(model)
    facts.setdefault("max_positions", getattr(model.config, "max_position_embeddings", None))
    facts.setdefault("encoder_decoder", bool(getattr(model.config, "is_encoder_decoder", False)))
    if config is not None:
        config.update(**facts.pop("generation", {}))  # what the model's own generate overrides (BLIP's end token)
    options = {
        "verify": verify,
        "quant_config": quant_config,
        "target": target,
        "progress": progress,
        "metadata": {METADATA: _described(family, facts, config)},
    }
    edge = family.convert(model, sample, {**family.sizes, **sizes}, options)
    return GenerativeModel(edge, family, facts, config)


def load(path: str | os.PathLike, *, num_threads: int | None = None) -> GenerativeModel:
    """A file written by `GenerativeModel.export`, ready to `generate` (or `embed`) without
    the PyTorch model: its family, the facts generation reads and the generation config
    travel in the file's metadata (entry "litert_torch.generative", JSON)."""
    from litert_torch.edge_model import load as load_edge
    from runtimes.targets.model_view import metadata_entry

    edge = load_edge(path, num_threads=num_threads)
    raw = metadata_entry(edge.model_content(), METADATA)
    if raw is None:
        raise ValueError(
            f"{os.fspath(path)}: no {METADATA} metadata; it was not written by litert_torch.generative.convert "
            "(load it with litert_torch.load)"
        )
    described = json.loads(raw)
    families = {f.name: f for f in FAMILIES}
    if described["family"] not in families:
        raise ValueError(f"{os.fspath(path)}: family {described['family']!r} is not one this version knows")
    config = described["generation_config"]
    if config is not None:
        from transformers import GenerationConfig

        config = GenerationConfig.from_dict(config)
    return GenerativeModel(edge, families[described["family"]], described["facts"], config)


def _described(family: Family, facts: dict, config) -> bytes:
    """What `load` needs besides the signatures, as JSON."""
    return json.dumps(
        {"family": family.name, "facts": facts, "generation_config": None if config is None else config.to_diff_dict()}
    ).encode()


def _inputs(family: Family, inputs: dict) -> dict:
    """The processor outputs the family reads; any other is refused by name."""
    inputs = {k: v for k, v in inputs.items() if v is not None}
    unknown = sorted(set(inputs) - set(family.inputs))
    if unknown:
        raise TypeError(
            f"{', '.join(unknown)}: not an input of this {family.name}, which reads {', '.join(family.inputs)}"
        )
    return inputs


class GenerativeModel:
    """A converted generative model: `generate(**inputs, ...)` as transformers' `generate`,
    or `embed(**inputs)` for embedders; `edge` is the LiteRT model (`export(path)` writes it)."""

    def __init__(self, edge: EdgeModel, family: Family, facts: dict, generation_config):
        self.edge, self.family, self.facts = edge, family, facts
        self.generation_config = generation_config

    def __repr__(self) -> str:
        signatures = ", ".join(s.key for s in self.edge.runtime.signatures)
        return f"GenerativeModel({self.family.name}: {signatures})"

    def export(self, path: str | os.PathLike) -> str:
        """Write the .tflite file (atomically); `load(path)` makes it a GenerativeModel again."""
        return self.edge.export(path)

    def generate(self, generation_config=None, *, seed: int | None = None, streamer=None, **kwargs) -> torch.Tensor:
        """The ids transformers' `model.generate(**inputs, **kwargs)` returns, generated in
        LiteRT (see the module docstring). `kwargs`: the processor's outputs and any field of
        a GenerationConfig (max_new_tokens, min_new_tokens, do_sample, temperature, top_k,
        top_p, repetition_penalty, eos_token_id, ...). `streamer`: a transformers streamer
        (`TextStreamer(tokenizer)`, `TextIteratorStreamer`): given the prompt, then each token
        as it is picked, then `end()`, as transformers gives them (one row only)."""
        if self.family.generate is None:
            raise TypeError(f"this {self.family.name} does not generate: call embed(**inputs)")
        inputs = _inputs(self.family, {k: kwargs.pop(k) for k in list(kwargs) if k in self.family.inputs})
        config, unused = _resolved(self.generation_config, generation_config, kwargs)
        if unused:
            raise TypeError(
                f"generate() got {', '.join(sorted(unused))}: neither an input of this {self.family.name} "
                f"({', '.join(self.family.inputs)}) nor a generation field"
            )
        eos = _ids(config.eos_token_id)
        if "input_ids" in inputs and "attention_mask" in self.family.inputs and "attention_mask" not in inputs:
            inputs["attention_mask"] = _inferred_mask(inputs["input_ids"], config.pad_token_id, eos)
        rows = self.family.rows(inputs, self.facts)
        pad = config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else 0)
        if config.do_sample and seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())  # torch.manual_seed reproduces the run
        if config.output_scores and config.do_sample:
            raise NotImplementedError(
                "output_scores with do_sample: the sampler's warped scores are not kept; pass output_logits=True "
                "(the logits each token was drawn from) instead"
            )
        if streamer is not None and len(rows) > 1:
            raise ValueError(f"a streamer takes one row at a time; the batch has {len(rows)} (as transformers)")
        outputs, pickers = [], []
        for i, row in enumerate(rows):
            prefix = [int(t) for t in row["prefix"]]
            max_new = _max_new_tokens(config, len(prefix), self.facts.get("max_positions"))
            sampler = _sampler(config, None if seed is None else seed + i)
            on_pick = None if streamer is None else (lambda token: streamer.put(torch.tensor([token])))
            picker = Picker(
                sampler,
                _rules(config, eos, len(prefix)),
                prefix,
                max_new,
                row.get("encoder_ids"),
                on_pick,
                keep_logits=bool(config.return_dict_in_generate and config.output_logits),
                keep_scores=bool(config.return_dict_in_generate and config.output_scores),
            )
            if streamer is not None:
                streamer.put(torch.tensor([prefix]))
            new = self.family.generate(self.edge, row, max_new, picker, eos, self.facts)
            if streamer is not None:
                streamer.end()
            # Whisper's generate returns the new tokens alone, but its dict output the whole sequence
            whole = self.facts.get("returns_prompt", True) or config.return_dict_in_generate
            outputs.append((prefix if whole else []) + [int(t) for t in new])
            pickers.append(picker)
        width = max(len(o) for o in outputs)
        sequences = torch.tensor([o + [pad] * (width - len(o)) for o in outputs], dtype=torch.long)
        if not config.return_dict_in_generate:
            return sequences
        return self._output(sequences, pickers, config)

    def _output(self, sequences: torch.Tensor, pickers: list[Picker], config):
        """transformers' GenerateDecoderOnlyOutput / GenerateEncoderDecoderOutput with the
        logits (`output_logits`) and scores (`output_scores`) of each step, (batch, vocab) per
        step; a row that ended earlier than others has NaN rows after its end (it is not run
        further, where transformers runs it on padding)."""
        from transformers.generation import GenerateDecoderOnlyOutput, GenerateEncoderDecoderOutput

        def per_step(name: str):
            steps = max(len(getattr(p, name)) for p in pickers)
            vocab = len(getattr(pickers[0], name)[0])
            table = np.full((steps, len(pickers), vocab), np.nan, np.float32)
            for row, picker in enumerate(pickers):
                for step, values in enumerate(getattr(picker, name)):
                    table[step, row] = values
            return tuple(torch.from_numpy(t) for t in table)

        cls = GenerateEncoderDecoderOutput if self.facts.get("encoder_decoder") else GenerateDecoderOnlyOutput
        return cls(
            sequences=sequences,
            logits=per_step("logits") if config.output_logits else None,
            scores=per_step("scores") if config.output_scores else None,
        )

    def embed(self, **inputs) -> torch.Tensor:
        """Embeddings (batch, dim) of a sentence or image embedder, computed in LiteRT."""
        if self.family.embed is None:
            raise TypeError(f"this {self.family.name} does not embed: call generate(**inputs)")
        return torch.from_numpy(np.asarray(self.family.embed(self.edge, _inputs(self.family, inputs), self.facts)))


def _rules(config, eos: list[int], prefix_len: int) -> LogitsRules:
    """The logits processors `config` asks for, for a row whose output starts with `prefix_len` ids."""
    return LogitsRules(
        eos=tuple(eos),
        min_new=max(config.min_new_tokens or 0, (config.min_length or 0) - prefix_len),
        repetition_penalty=config.repetition_penalty,
        no_repeat_ngram=config.no_repeat_ngram_size,
        encoder_no_repeat_ngram=config.encoder_no_repeat_ngram_size,
        forced_bos=config.forced_bos_token_id,
        forced_eos=config.forced_eos_token_id,
        suppress=tuple(_ids(config.suppress_tokens)),
        begin_suppress=tuple(_ids(config.begin_suppress_tokens)),
    )


def _inferred_mask(input_ids, pad: int | None, eos: list[int]):
    """transformers' mask for ids given without one: 0 at `pad` where `pad` occurs and is not
    an end token, else all ones."""
    ids = torch.as_tensor(np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids))
    if pad is None or ids.ndim != 2 or pad in eos or not (ids == pad).any():
        return torch.ones_like(ids)
    return (ids != pad).long()


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _resolved(model_config, given, kwargs: dict):
    """The model's generation config updated as transformers updates it (a config passed,
    then keyword fields), and the keywords that are not fields; refuses fields the loop does
    not apply."""
    from transformers import GenerationConfig

    config = copy.deepcopy(given if given is not None else model_config or GenerationConfig())
    unused = config.update(**kwargs)
    for name, value in config.to_diff_dict().items():
        if name in APPLIED or name in NEUTRAL or value is None or (name in SAMPLING_ONLY and not config.do_sample):
            continue
        if NEUTRAL_VALUES.get(name, object()) == value:
            continue
        raise NotImplementedError(
            f"generation_config.{name}={value!r} is not applied by the LiteRT generation loop (it applies "
            f"{', '.join(sorted(APPLIED))}): pass {name}={NEUTRAL_VALUES.get(name)!r} to generate without it"
        )
    return config, unused


def _max_new_tokens(config, prefix_len: int, max_positions: int | None) -> int:
    """transformers' rule: max_new_tokens, else max_length less the prompt, else 20 new
    tokens (within the model's positions)."""
    if config.max_new_tokens is not None:
        count = config.max_new_tokens
    elif config.max_length is not None:
        count = config.max_length - prefix_len
    else:
        count = DEFAULT_NEW_TOKENS if max_positions is None else min(DEFAULT_NEW_TOKENS, max_positions - prefix_len)
    if count < 1:
        raise ValueError(
            f"nothing to generate: the prompt has {prefix_len} tokens and max_length is {config.max_length}; "
            "pass max_new_tokens"
        )
    return count


def _sampler(config, seed: int | None) -> Sampler:
    if not config.do_sample:
        return Sampler()
    top_p = config.top_p if config.top_p is not None and config.top_p < 1 else None
    top_k = DEFAULT_TOP_K if config.top_k is None else (config.top_k or None)
    temperature = 1.0 if config.temperature is None else config.temperature
    return Sampler(temperature, top_k, top_p, seed)
