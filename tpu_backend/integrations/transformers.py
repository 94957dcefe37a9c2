"""Hugging Face transformers (and safetensors) on the "tpu" device.

What works without anything from us: `model.to("tpu")` and training, and
`AutoModel.from_pretrained(local_dir, device_map="tpu")` (through accelerate).

`generate()` without a compile per token: XLA compiles one program per shape, and
transformers' defaults grow shapes every token (a `DynamicCache` concatenates keys and
values; the loop concatenates `input_ids` and the attention mask). On a tpu model:
- the default cache (no `cache_implementation`, no `cache` passed) is transformers'
  `StaticCache` (shapes fixed for the whole call), its length rounded up to a bucket
  (`cache_length`: powers of two from 128) so calls with other prompt lengths or
  `max_new_tokens` reuse the decode programs; with a static cache transformers itself
  compiles the decode step (`torch.compile(backend="tpu")`, one program per token). An
  explicit `cache_implementation="static"` keeps transformers' sizing (`max_cache_len`);
- the decoder layers are nested compile regions for the call (`layer_regions`, over each
  layer's static cache tensors), so Dynamo traces one layer and stamps it out, and
  AOTAutograd handles one; the decode program is the same. On this CPU host (22 layers,
  2026-12-06) the decode step's Dynamo went from 3.5 to 2.4 s and AOTAutograd from 2.9 to
  1.2 s. `COMPILE_LAYERS_ONCE = False` traces every layer (the A/B switch of
  `benchmarks/device/hf_bench.py --layer-regions`);
- greedy decoding with such a step picks each token on the device and the host reads it a
  step late, so it prepares the next step while the chip runs this one (`greedy_decoding`);
- the loop's token bookkeeping (`input_ids`, attention mask, a float one too, logits processors,
  sampling, beam scores) runs on the host, as transformers' generation loop allows
  ("inputs on CPU ... stay off-device"): only the new token, its position and mask go
  to the device, in one transfer (each transfer costs ~0.2 ms of host time on a TPU
  host), and only the last position's logits come back; results return to the device
  the inputs came from. Encoder-decoder models too (T5, BART, ...): their encoder runs
  on the device on its inputs moved there, their growing decoder ids stay on the host (on
  the device they compiled three small programs per new length); Whisper's own generate()
  builds logits processors on its inputs' device before it calls this one, so its loop
  stays there. The mask built on the host needs the cache's length, which a
  static cache keeps on the device (a read costs a TPU host ~0.45 ms per token): the
  host knows it from `input_ids` (every token but those fed this step is in the cache)
  and hands it to the mask (`_host_query_offset`). Assisted decoding (an assistant model,
  prompt lookup) keeps its bookkeeping on the device: its loop mixes the two devices;
- a static cache with sliding-window layers (Mistral, Gemma 2 and 3, ...) decodes eagerly,
  with a warning: such a layer keeps its length as a Python int that the mask reads, Dynamo
  guards on it, and the compiled step recompiled for every token up to the recompile limit
  (then ran eagerly anyway). Eagerly, the static shapes compile no program after a warm-up;
- caches that cannot run here are refused with what to use instead; a DynamicCache (asked
  for, passed in, or the default of a model transformers cannot compile) works but warns
  that it compiles programs for every token.

What needs us too: `save_pretrained` finds tied weights with
`transformers.pytorch_utils.id_tensor_storage`, which keys a tensor by its storage's
address. A tpu storage holds no host bytes (`data_ptr()` is 0 for every tensor), so
every weight looked tied to every other and saving failed (accelerate's `save_state` and
`save_model`, with their own copy of the function, kept one weight of the model). We key
tpu tensors by the storage's identity instead (the key our payload table uses: two tensors
alias exactly when they share a storage). safetensors itself skips zero-byte storages in its alias
check and copies non-CPU tensors to the host, so it needs nothing. PEFT's adapter
`save_pretrained` keeps its own copy of the function (`peft.utils.other`): every adapter
looked aliased there and was cloned on the device before saving; it gets the same key.
"""

from __future__ import annotations

import functools
import warnings

import torch

from tpu_backend.integrations import greedy_decoding, layer_regions, prompt_steps
from tpu_backend.integrations.post_import import when_imported

DEVICE_TYPE = "tpu"
# A static cache's length is rounded up to the next power of two, at least this (an exact
# length would compile new decode programs for every new prompt length or max_new_tokens),
# and at least what the decode step can read for CACHE_READ_SHARE of its weight reads
# (`affordable_cache_length`).
MIN_CACHE_LENGTH = 128
CACHE_READ_SHARE = 0.02
# The decoder layers as nested compile regions while generate() runs (`layer_regions`).
COMPILE_LAYERS_ONCE = True
# An encoder-decoder's text source is padded to a power of two of at least this many tokens
# (`_source_padded_to_a_bucket`).
MIN_SOURCE_LENGTH = 16
_SOURCE_POSITION_LIMITS = ("max_position_embeddings", "max_encoder_position_embeddings", "max_source_positions")
_OUTPUTS_SHOWING_THE_SOURCE = ("output_attentions", "output_hidden_states")
# Integer inputs of generate() that its loop grows or reads every step: kept on the host.
_BOOKKEEPING_INPUTS = ("input_ids", "attention_mask", "position_ids", "token_type_ids")
# ... and an encoder-decoder model's, whose encoder inputs go back to the device for the encoder
_DECODER_BOOKKEEPING_INPUTS = ("decoder_input_ids", "decoder_attention_mask")
# generate() options that decode with candidate tokens (transformers' assisted loop)
_ASSISTED_OPTIONS = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")
_UNSUPPORTED_CACHES = {
    "quantized": "its backends (optimum-quanto, HQQ) have no tpu kernels",
    "paged": "continuous batching runs paged-attention kernels that have no tpu lowering",
}
# Modules holding their own reference to `id_tensor_storage` (`from ... import`).
_USERS_OF_ID_TENSOR_STORAGE = (
    "transformers.pytorch_utils",
    "transformers.modeling_utils",
    "peft.utils.other",
    "peft.utils",
    "peft.peft_model",
    "accelerate.utils.modeling",
    "accelerate.utils.other",
    "accelerate.utils",
)


def _is_tpu(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == DEVICE_TYPE


def storage_identity(tensor: torch.Tensor) -> int:
    """A unique id of the tensor's storage for its lifetime (shared by views and ties)."""
    return tensor.untyped_storage()._cdata


def _patch_id_tensor_storage(module) -> None:
    original = getattr(module, "id_tensor_storage", None)
    if original is None or getattr(original, "_tpu_aware", False):
        return

    @functools.wraps(original)
    def id_tensor_storage(tensor):
        if _is_tpu(tensor):
            return tensor.device, storage_identity(tensor), tensor.nbytes
        return original(tensor)

    id_tensor_storage._tpu_aware = True
    module.id_tensor_storage = id_tensor_storage


def cache_length(needed: int, model=None, batch: int = 1) -> int:
    """The static cache length a generate() call needing `needed` positions gets: a bucket,
    at least `affordable_cache_length(model, batch)`."""
    from tpu_backend.compile.dynamic import Buckets  # (the compile package: imported only when generating)

    floor = MIN_CACHE_LENGTH if model is None else affordable_cache_length(model, batch)
    return Buckets.powers_of_two(minimum=floor)(needed)


def affordable_cache_length(model, batch: int) -> int:
    """The longest cache (a power of two, at least MIN_CACHE_LENGTH, at most the model's
    positions) whose keys and values a decode step reads in CACHE_READ_SHARE of what it
    reads of the weights: a decode step reads the whole static cache, so a longer one costs
    that share at most, while every new length bucket is a new decode program to compile (on
    a v5e 28 s for a 1.1B Llama: a 257-token generation after a 64-token one stalled there).
    A 1.1B Llama in bfloat16 gets 1024 positions at batch 1, the minimum at batch 8."""
    weights = getattr(model, "_tpu_decode_weight_bytes", None)
    if weights is None:
        embedding = model.get_input_embeddings().weight
        weights = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding)
        model._tpu_decode_weight_bytes = weights
    config = model.config.get_text_config(decoder=True)
    shape = model._get_static_cache_init_shape()  # (key/value heads, head dim) a layer caches
    if shape is None or not getattr(config, "num_hidden_layers", None):
        return MIN_CACHE_LENGTH
    heads, dims = ([v] * config.num_hidden_layers if isinstance(v, int) else v for v in shape)  # (per layer)
    per_position = 2 * sum(h * d for h, d in zip(heads, dims)) * model.dtype.itemsize * batch
    length = MIN_CACHE_LENGTH
    limit = min(CACHE_READ_SHARE * weights / per_position, getattr(config, "max_position_embeddings", None) or 0)
    while 2 * length <= limit:
        length *= 2
    return length


def _on_device(model) -> bool:
    return getattr(getattr(model, "device", None), "type", None) == DEVICE_TYPE


def _refuse_unsupported_cache(cache_implementation) -> None:
    if cache_implementation in _UNSUPPORTED_CACHES:
        raise NotImplementedError(
            f"generate(cache_implementation={cache_implementation!r}) is not supported on the tpu device: "
            f"{_UNSUPPORTED_CACHES[cache_implementation]}. Leave cache_implementation unset (a static cache "
            "of bucketed length, decode compiled once) or pass cache_implementation='static'."
        )


def _to_host(value):
    return value.cpu() if _is_tpu(value) and not value.is_floating_point() else value


def _tensor_to_host(value):
    return value.cpu() if _is_tpu(value) else value


def _to_model_device(device: torch.device, value):
    return value.to(device) if isinstance(value, torch.Tensor) and not value.is_floating_point() else value


def _bookkeeping_on_device(model, kwargs: dict) -> bool:
    """Whether generate() calls the model on its bookkeeping itself, so that the bookkeeping
    stays on the device: decoding with candidates (an assistant model, prompt lookup, early
    exit: transformers' assisted loop mixes the inputs' and the model's devices when they
    differ), and classifier-free guidance (its logits processor runs the model on the
    sequence so far)."""
    config = kwargs.get("generation_config") or model.generation_config
    guidance = kwargs.get("guidance_scale", getattr(config, "guidance_scale", None))
    assisted = any(
        kwargs.get(name) is not None or getattr(config, name, None) is not None for name in _ASSISTED_OPTIONS
    )
    return assisted or (guidance is not None and guidance != 1)


def _to_device(result, device: torch.device):
    """generate()'s result (a tensor or a ModelOutput) with its tensors on `device`, cache left as is."""
    from transformers.pytorch_utils import move_to_device

    if isinstance(result, torch.Tensor):
        return result.to(device)
    for key in list(result.keys()):
        if key != "cache":
            result[key] = move_to_device(result[key], device)
    return result


def _moved_in_one_transfer(move_to_device):
    """transformers' `move_to_device(value, device)` that moves every CPU tensor in `value`
    (the forward's inputs, nested in dicts, lists and tuples) to a tpu device at once."""
    from torch.utils import _pytree as pytree

    from tpu_backend import tensor as device_tensor

    @functools.wraps(move_to_device)
    def move_in_one_transfer(value, device):
        device = torch.device(device)
        if device.type != DEVICE_TYPE:
            return move_to_device(value, device)
        if not any(isinstance(leaf, torch.Tensor) and leaf.device != device for leaf in pytree.tree_leaves(value)):
            return value  # (transformers moved them already)
        return device_tensor.tree_to_device(value, lambda leaf: move_to_device(leaf, device))

    return move_in_one_transfer


def _patch_prepare_inputs(module) -> None:
    """`prepare_inputs_for_generation` of a decoder-only model on the device:
    - the forward's inputs reach the device (in one transfer): transformers moves them only
      when the model input it checks is a tensor, and assisted decoding's first step passes
      `inputs_embeds=None`, which left `input_ids` and `position_ids` on the host;
    - while it builds a step's mask on the host, the cache's query offset (the tokens
      already in it) comes from the host's `input_ids` instead of a read of the static
      cache's device counter: for steps fed from `input_ids` (a prompt given as
      `inputs_embeds` is not in them) that say how many tokens they feed; any other call
      reads the cache as before."""
    cache_class, mixin = module.Cache, module.GenerationMixin
    get_query_offset, prepare_inputs = cache_class.get_query_offset, mixin.prepare_inputs_for_generation

    @functools.wraps(get_query_offset)
    def query_offset(self, layer_idx: int = 0):
        offset = getattr(self, "_host_query_offset", None)
        return get_query_offset(self, layer_idx) if offset is None else offset

    @functools.wraps(prepare_inputs)
    def prepare_inputs_on_device(self, input_ids, *args, **kwargs):
        if not _on_device(self):
            return prepare_inputs(self, input_ids, *args, **kwargs)
        if self.config.is_encoder_decoder:  # (the cache's query offset is the decoder's: not known here)
            return module.move_to_device(prepare_inputs(self, input_ids, *args, **kwargs), self.device)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        fed = kwargs.get("next_sequence_length")
        offset_known = (
            isinstance(cache, cache_class)
            and fed is not None
            and not args
            and kwargs.get("inputs_embeds") is None
            and not _is_tpu(input_ids)
        )
        if offset_known:
            cache._host_query_offset = input_ids.shape[-1] - fed
        try:
            model_inputs = prepare_inputs(self, input_ids, *args, **kwargs)
        finally:
            if offset_known:
                cache._host_query_offset = None
        return module.move_to_device(model_inputs, self.device)

    cache_class.get_query_offset = query_offset
    mixin.prepare_inputs_for_generation = prepare_inputs_on_device
    _patch_encoder_call(module)


def _patch_encoder_call(module) -> None:
    """An encoder-decoder model on the device whose generate() keeps its bookkeeping on the
    host: its encoder runs on the device, on its inputs (and their mask) moved there."""
    mixin = module.GenerationMixin
    encode = mixin._prepare_text_encoder_decoder_kwargs_for_generation

    @functools.wraps(encode)
    def encode_on_device(self, inputs_tensor, model_kwargs, *args, **kwargs):
        if _on_device(self):
            encoder_kwargs = {key: value for key, value in model_kwargs.items() if not key.startswith("decoder_")}
            inputs_tensor, encoder_kwargs = module.move_to_device((inputs_tensor, encoder_kwargs), self.device)
            model_kwargs = {**model_kwargs, **encoder_kwargs}  # (one transfer for all of them)
        return encode(self, inputs_tensor, model_kwargs, *args, **kwargs)

    mixin._prepare_text_encoder_decoder_kwargs_for_generation = encode_on_device


def _patch_sample(mixin) -> None:
    """Greedy decoding of a model on the device takes the device's loop where it applies
    (`greedy_decoding`: the token chosen in the compiled step, read one step late)."""
    sample = mixin._sample

    @functools.wraps(sample)
    def sample_on_device(
        self,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus=False,
        streamer=None,
        **model_kwargs,
    ):
        if (
            _on_device(self)
            and not self.config.is_encoder_decoder
            and not _is_tpu(input_ids)
            and greedy_decoding.applies(
                self, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs
            )
        ):
            return greedy_decoding.greedy_search(
                self, input_ids, logits_processor, stopping_criteria, generation_config, streamer, model_kwargs
            )
        return sample(
            self,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus,
            streamer,
            **model_kwargs,
        )

    mixin._sample = sample_on_device


def _patch_generate(module) -> None:
    """Wrap `GenerationMixin.generate` and its cache preparation for models on the device."""
    mixin = module.GenerationMixin
    if getattr(mixin.generate, "_tpu_aware", False):
        return
    generate, prepare_cache = mixin.generate, mixin._prepare_cache_for_generation
    module.move_to_device = _moved_in_one_transfer(module.move_to_device)
    _patch_prepare_inputs(module)
    _patch_sample(mixin)

    @functools.wraps(generate)
    def generate_on_device(self, inputs=None, *args, **kwargs):
        encoder_decoder = self.config.is_encoder_decoder
        # an encoder-decoder model with a generate() of its own (Whisper) builds logits
        # processors on its inputs' device before calling this one: its loop stays there
        if not _on_device(self) or (encoder_decoder and type(self).generate is not generate_on_device):
            return generate(self, inputs, *args, **kwargs)
        _refuse_unsupported_cache(kwargs.get("cache_implementation"))
        main_input = kwargs.get(self.main_input_name, kwargs.get("input_ids"))
        device = next((v.device for v in (inputs, main_input) if isinstance(v, torch.Tensor)), None)
        if _bookkeeping_on_device(self, kwargs):
            place = place_kwarg = functools.partial(_to_model_device, self.device)
            moved = _BOOKKEEPING_INPUTS
        elif encoder_decoder:  # the encoder's input too, floats included: the loop follows its device
            place = place_kwarg = _tensor_to_host
            moved = (*_BOOKKEEPING_INPUTS, *_DECODER_BOOKKEEPING_INPUTS, self.main_input_name)
        else:  # (a float attention mask too: on the device its growth was 5 eager programs a token)
            place, place_kwarg, moved = _to_host, _tensor_to_host, _BOOKKEEPING_INPUTS
        inputs = place(inputs)
        kwargs = {k: place_kwarg(v) if k in moved else v for k, v in kwargs.items()}
        if encoder_decoder and not _bookkeeping_on_device(self, kwargs):
            inputs, kwargs = _source_padded_to_a_bucket(self, inputs, kwargs)
        from tpu_backend.compile import scan  # (here: `import tpu_backend` leaves torch.compile's side unloaded)

        layers = scan.repeated_blocks(self) if COMPILE_LAYERS_ONCE and not encoder_decoder else None
        with layer_regions.marked(layers):
            result = generate(self, inputs, *args, **kwargs)
        return result if device is None else _to_device(result, device)

    @functools.wraps(prepare_cache)
    def prepare_cache_on_device(self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length):
        if _on_device(self) and generation_config.use_cache:
            implementation, passed = generation_config.cache_implementation, model_kwargs.get("cache")
            _refuse_unsupported_cache(implementation)
            dynamic = passed is None and implementation in (None, "dynamic", "offloaded")
            if implementation is None and passed is None and _static_cache_works(self):
                generation_config.cache_implementation = "static"  # (a per-call copy of the config)
                needed = max(max_cache_length, generation_config.max_cache_len or 0)
                max_cache_length = cache_length(needed, self, batch_size)
            elif dynamic or type(passed) is module.DynamicCache:
                warnings.warn(
                    "generate() on the tpu device with a DynamicCache compiles new programs for every generated "
                    "token (its shapes grow); pass cache_implementation='static' (or leave it unset on a model "
                    "transformers can compile) for one decode program",
                    RuntimeWarning,
                    stacklevel=3,
                )
        prepared = prepare_cache(self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length)
        if (
            _on_device(self)
            and _has_sliding_layers(model_kwargs.get("cache"))
            and not generation_config.disable_compile
        ):
            warnings.warn(
                "generate() on the tpu device decodes this model eagerly: its static cache has sliding-window "
                "layers, whose Python-int length Dynamo guards on, so the compiled step would recompile for every "
                "token until torch._dynamo's recompile limit (8) and then run eagerly anyway",
                RuntimeWarning,
                stacklevel=3,
            )
            generation_config.disable_compile = True  # (the per-call copy)
        return prepared

    generate_on_device._tpu_aware = True
    mixin.generate = generate_on_device
    mixin._prepare_cache_for_generation = prepare_cache_on_device
    _patch_prefill(mixin)


def _patch_prefill(mixin) -> None:
    """transformers' loops (sampling, beam search, greedy with logits processors) take a
    short prompt through the compiled forward they decode with, a token at a time
    (`prompt_steps`), where the device would compile the prefill's per-op programs."""
    prefill = mixin._prefill

    @functools.wraps(prefill)
    def prefill_on_device(self, input_ids, generation_config, model_kwargs, is_first_iteration=True):
        if (
            _on_device(self)
            and is_first_iteration
            and generation_config.prefill_chunk_size is None
            and self._valid_auto_compile_criteria(model_kwargs, generation_config)
            and prompt_steps.applies(self, input_ids, model_kwargs)
        ):
            forward = self.get_compiled_call(generation_config.compile_config)
            with self._optimize_model_for_decode():  # (as the decode steps run: MoE experts switch)
                outputs = prompt_steps.feed(
                    self, lambda inputs: forward(**inputs, return_dict=True), input_ids, model_kwargs
                )
            if outputs is not None:
                return outputs
        return prefill(self, input_ids, generation_config, model_kwargs, is_first_iteration)

    mixin._prefill = prefill_on_device


def _source_padded_to_a_bucket(model, inputs, kwargs: dict) -> tuple:
    """generate()'s text source (token ids on the host and their attention mask) padded to
    `source_length` with the mask 0 there, so an encoder-decoder's encoder programs and its
    decode step (whose static cross-attention cache is as long as the source) are compiled
    per length bucket instead of per length. Before, every new source length traced and
    compiled the decode step again, and after Dynamo's 8 recompiles decoding ran eagerly for
    the rest of the process (an evaluation loop over batches of varying length). The masked
    positions change nothing: the encoder's queries and the decoder's cross-attention never
    see them. Left as they are: sources without a mask, calls that return the encoder's
    states or the attentions (their shapes would show the padding), and models whose
    encoder mixes positions outside the mask (`_pads_exactly`)."""
    ids = inputs if inputs is not None else kwargs.get("input_ids")
    mask = kwargs.get("attention_mask")
    config = kwargs.get("generation_config") or model.generation_config
    if not (
        model.main_input_name == "input_ids"
        and isinstance(ids, torch.Tensor)
        and ids.dim() == 2
        and not ids.is_floating_point()
        and isinstance(mask, torch.Tensor)
        and mask.shape == ids.shape
        and kwargs.get("encoder_outputs") is None
        and not any(kwargs.get(name, getattr(config, name, False)) for name in _OUTPUTS_SHOWING_THE_SOURCE)
        and _pads_exactly(model.config)
    ):
        return inputs, kwargs
    padding = source_length(ids.shape[1], model.config) - ids.shape[1]
    if padding <= 0:
        return inputs, kwargs
    pad_id = next((v for v in (config.pad_token_id, model.config.pad_token_id) if isinstance(v, int)), 0)
    ids = torch.nn.functional.pad(ids, (0, padding), value=pad_id)
    kwargs = {**kwargs, "attention_mask": torch.nn.functional.pad(mask, (0, padding), value=0)}
    return (ids, kwargs) if inputs is not None else (None, {**kwargs, "input_ids": ids})


def source_length(length: int, config) -> int:
    """The padded length of an encoder-decoder's source of `length` tokens: the next power of
    two, at least MIN_SOURCE_LENGTH, at most the encoder's positions (never below `length`)."""
    from tpu_backend.compile.dynamic import Buckets

    limits = [getattr(config, name, None) for name in _SOURCE_POSITION_LIMITS]
    limit = min((v for v in limits if isinstance(v, int) and v > 0), default=None)
    padded = Buckets.powers_of_two(minimum=MIN_SOURCE_LENGTH)(length)
    return padded if limit is None else max(length, min(padded, limit))


def _pads_exactly(config) -> bool:
    """Whether padding the source (mask 0) leaves the real positions' results as they were:
    not for mixtures of experts, whose routers give padded tokens a share of each expert's
    capacity, nor for block-sparse attention, which a longer source can switch on."""
    experts = any(getattr(config, name, None) for name in ("num_experts", "num_local_experts", "moe_layers"))
    return not experts and getattr(config, "attention_type", None) != "block_sparse"


def _has_sliding_layers(cache) -> bool:
    """Whether a cache transformers would compile (a static one) has sliding-window layers."""
    layers = getattr(cache, "layers", ()) if getattr(cache, "is_compileable", False) else ()
    return any(getattr(layer, "is_sliding", False) for layer in layers)


def _static_cache_works(model) -> bool:
    """Whether transformers' static cache decodes this model as its dynamic one does: the
    models transformers says compile (`_can_compile_fullgraph`) but not ALiBi Falcons, whose
    mask and ALiBi bias disagree in length with a static cache (transformers 5.24 raises
    "The size of tensor a (8) must match the size of tensor b (5)" on CPU too)."""
    return bool(model._can_compile_fullgraph) and not getattr(model.config, "alibi", False)


def _patch_compiled_call(module) -> None:
    """transformers compiles a model's decode forward as `torch.compile(self.__call__)`, whose
    frame (`Module._wrapped_call_impl`) is one code object for every model: after 8 models
    had sampled in a process, the 9th decoded eagerly (496 eager programs for 8 tokens). On
    the device each model gets a compiled call of its own code."""
    model_class = module.PreTrainedModel
    get_compiled_call = model_class.get_compiled_call
    if getattr(get_compiled_call, "_tpu_aware", False):
        return

    @functools.wraps(get_compiled_call)
    def get_compiled_call_on_device(self, compile_config):
        if not _on_device(self) or "llama4" in self.config.model_type:  # (transformers compiles no llama4)
            return get_compiled_call(self, compile_config)

        def make():
            def call(*args, **kwargs):
                return self(*args, **kwargs)

            return call

        config = compile_config or self._default_compile_config()
        return greedy_decoding.compiled_for(self, "_tpu_compiled_call", config, make)

    get_compiled_call_on_device._tpu_aware = True
    model_class.get_compiled_call = get_compiled_call_on_device


def install() -> None:
    for module_name in _USERS_OF_ID_TENSOR_STORAGE:
        when_imported(module_name, _patch_id_tensor_storage)
    when_imported("transformers.generation.utils", _patch_generate)
    when_imported("transformers.modeling_utils", _patch_compiled_call)
