"""transformers' generate() on the "tpu" device: CPU's tokens, CPU's logits at every step,
and no program compiled per generated token.

The model is a tiny Llama from a config with random weights; the tpu copy is shared by
the tests of this module (its compiled decode programs are what later calls reuse).
"""

from __future__ import annotations

import collections
import copy
import re
import warnings

import pytest
import torch
import transformers

import tpu_backend.compile as tpu_compile
from benchmarks.families import causal_lm as families
from tests.tpu_backend.test_transformers_integration import VOCAB, tiny_llama
from tpu_backend.compile import scan
from tpu_backend.compile.interpreter import GraphFunction
from tpu_backend.integrations import prompt_steps
from tpu_backend.integrations import transformers as hf_integration

LOGITS_TOLERANCE = dict(rtol=1e-4, atol=1e-4)  # float32 through a masked static cache vs CPU's dynamic one


@pytest.fixture(scope="module")
def models():
    cpu_model = tiny_llama().eval()
    tpu_model = tiny_llama().eval().to("tpu")
    return cpu_model, tpu_model


def prompt(length: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def compiled_programs() -> int:
    """torch.compile's programs built so far (compiled by XLA or loaded from the disk cache)."""
    total = tpu_compile.compile_stats().total()
    return total.misses + total.disk_hits


def programs_compiled() -> int:
    """Programs built so far: strict eager's per-op programs plus torch.compile's."""
    return torch.tpu.cache_stats()["misses"] + compiled_programs()


def generate_both(models, ids, **kwargs):
    cpu_model, tpu_model = models
    options = dict(do_sample=False, return_dict_in_generate=True, output_logits=True, **kwargs)
    on_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    return cpu_model.generate(ids, **options), tpu_model.generate(ids.to("tpu"), **on_tpu)


def assert_steps_match(tpu_out, cpu_out, field: str = "logits") -> None:
    assert tpu_out.sequences.device.type == "tpu"  # results return to the inputs' device
    assert torch.equal(tpu_out.sequences.cpu(), cpu_out.sequences)
    tpu_steps, cpu_steps = getattr(tpu_out, field), getattr(cpu_out, field)
    assert len(tpu_steps) == len(cpu_steps)
    for step, (actual, expected) in enumerate(zip(tpu_steps, cpu_steps)):
        torch.testing.assert_close(actual.cpu(), expected, **LOGITS_TOLERANCE, msg=f"{field} at step {step}")


def test_greedy_32_tokens_match_cpu_and_compile_no_program_per_token(models):
    ids = prompt(7)
    generate_both(models, ids, max_new_tokens=12)  # the warm-up call
    before = programs_compiled()
    cpu_out, tpu_out = generate_both(models, ids, max_new_tokens=32)
    compiled = programs_compiled() - before
    assert tpu_out.sequences.shape == (1, 7 + 32)
    assert_steps_match(tpu_out, cpu_out)
    assert compiled <= 16, f"{compiled} programs compiled for 32 new tokens after a warm-up"


# Families whose layers become regions (GPT-J's also pass inputs that alias each other: sin
# and cos, views of one tensor), and one whose sliding-window cache layers stay unmarked.
REGION_FAMILIES = ["llama", "qwen3", "gemma", "phi", "gptj", "mixtral (MoE)", "mistral (sliding_window)"]


@pytest.mark.parametrize("family", REGION_FAMILIES)
def test_decoder_layers_traced_once_decode_as_cpu(family, monkeypatch):
    """The decoder layers are nested compile regions over their static cache tensors
    (`layer_regions`): Dynamo traces one and stamps it out (every layer calls the same
    subgraph, each writing its own cache through `auto_functionalized_v2`); CPU's tokens
    and logits at every step, and the layers' own class again afterwards."""
    monkeypatch.setattr(hf_integration, "COMPILE_LAYERS_ONCE", True)
    regions = []
    writing_region = GraphFunction._call_writing_region
    monkeypatch.setattr(
        GraphFunction,
        "_call_writing_region",
        lambda self, node, *a: regions.append(node.kwargs["identifier"]) or writing_region(self, node, *a),
    )
    cpu_model = families.build(family)
    cpu_model.generation_config.eos_token_id, cpu_model.generation_config.pad_token_id = None, 0
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    ids = torch.randint(0, families.VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    cpu_out, tpu_out = generate_both((cpu_model, tpu_model), ids, max_new_tokens=10)  # past the window (8)
    assert_steps_match(tpu_out, cpu_out)
    layers = scan.repeated_blocks(tpu_model)
    if "sliding" in family:
        assert regions == []  # its cache layers slide: each layer traced as it is
    else:
        assert len(regions) == len(layers) and len(set(regions)) == 1, regions
    assert type(layers[0]) is type(scan.repeated_blocks(cpu_model)[0])


def test_layer_regions_compile_the_unmarked_decode_program(tmp_path, monkeypatch):
    """The regions change what Dynamo and AOTAutograd trace, not what runs: the decode
    step's StableHLO has the same operations, count for count, with the layers marked or
    not (the lowering inlines each region; a scan would stack the weights every token)."""
    cpu_model = families.build("qwen3")
    cpu_model.generation_config.eos_token_id, cpu_model.generation_config.pad_token_id = None, 0
    ids = torch.randint(0, families.VOCAB, (1, 5), generator=torch.Generator().manual_seed(1)).to("tpu")
    operations = {}
    for regions in (True, False):
        monkeypatch.setattr(hf_integration, "COMPILE_LAYERS_ONCE", regions)
        torch._dynamo.reset()
        with tpu_compile.dump(tmp_path / str(regions)):
            copy.deepcopy(cpu_model).to("tpu").generate(ids, max_new_tokens=3, do_sample=False)
        (program,) = (tmp_path / str(regions)).glob("torch_compile_*.stablehlo.mlir")
        operations[regions] = collections.Counter(re.findall(r"stablehlo\.\w+", program.read_text()))
    assert operations[True]["stablehlo.dot_general"] >= 7 * 2  # the layers' matmuls: a decode step
    assert operations[True] == operations[False]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(families.FAMILIES))
def test_every_decoder_family_generates_as_cpu(family):
    """The device's generate() defaults (static cache where it works, layers as regions,
    the device's greedy loop) on every family of the generative tests: CPU's tokens and
    logits at every step, past each sliding window."""
    cpu_model = families.build(family)
    cpu_model.generation_config.eos_token_id, cpu_model.generation_config.pad_token_id = None, 0
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    ids = torch.randint(0, families.VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dynamic-cache warning of the families that keep one
        cpu_out, tpu_out = generate_both((cpu_model, tpu_model), ids, max_new_tokens=12)
    assert_steps_match(tpu_out, cpu_out)


def eager_requests(model, ids, new_tokens: int) -> int:
    """Strict eager programs launched (or compiled) by one greedy generate()."""
    from tpu_backend import tensor as device_tensor

    def count():
        return torch.tpu.cache_stats()["requests"] + sum(device_tensor.EAGER_STORAGE_CALLS.values())

    before = count()
    model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    return count() - before


def test_one_models_recompiles_leave_other_models_compiled():
    """Dynamo counts recompiles per code object. The device's decode step was one function
    for every model, so once one model's step passed the limit, every later model decoded
    eagerly (a sliding-window cache did it in 8 tokens). Here the limit is 1: model A
    recompiles for a second batch size, and model B (another shape, so A's step's guards
    fail on it) still decodes compiled: no eager program per extra token."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1):
        first = tiny_llama().eval().to("tpu")
        first.generate(prompt(5).to("tpu"), max_new_tokens=3, do_sample=False)
        first.generate(prompt(5, batch=2).to("tpu"), max_new_tokens=3, do_sample=False)  # past A's limit
        second = families.build("llama").to("tpu")
        second.generation_config.eos_token_id = None
        ids = torch.randint(0, families.VOCAB, (1, 5), generator=torch.Generator().manual_seed(1)).to("tpu")
        eager_requests(second, ids, 4)  # warm-up
        assert eager_requests(second, ids, 12) == eager_requests(second, ids, 4)
    torch._dynamo.reset()  # (the steps compiled under the lower limit)


def test_sampling_models_past_the_recompile_limit_stay_compiled():
    """transformers compiles the forward it samples with as `torch.compile(self.__call__)`,
    one code object for every model: past the recompile limit (8 models in a process, 1
    here) every later model sampled eagerly. On the device each model's compiled call has its
    own code: model B (another shape) samples with no eager program per extra token."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1):
        first = tiny_llama().eval().to("tpu")
        first.generate(prompt(5).to("tpu"), max_new_tokens=3, do_sample=True, top_k=4)
        second = families.build("llama").to("tpu")
        second.generation_config.eos_token_id = None
        ids = torch.randint(0, families.VOCAB, (1, 5), generator=torch.Generator().manual_seed(1)).to("tpu")

        def sampled(new_tokens):
            before = torch.tpu.cache_stats()["requests"]
            second.generate(ids, max_new_tokens=new_tokens, do_sample=True, top_k=4)
            return torch.tpu.cache_stats()["requests"] - before

        sampled(4)  # warm-up
        assert sampled(12) == sampled(4)
    torch._dynamo.reset()


def test_sliding_window_cache_decodes_eagerly_as_cpu():
    """A static cache with sliding-window layers keeps its length as a Python int that the
    mask reads, and Dynamo guards on it: the compiled step recompiled for every token up to
    the recompile limit, then ran eagerly. Such a model decodes eagerly from the start
    (warned): CPU's tokens and logits, and no new program after a warm-up."""
    cpu_model = families.build("mistral (sliding_window)")
    cpu_model.generation_config.eos_token_id, cpu_model.generation_config.pad_token_id = None, 0
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    ids = torch.randint(0, families.VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    before = compiled_programs()
    with pytest.warns(RuntimeWarning, match="decodes this model eagerly"):
        cpu_out, tpu_out = generate_both((cpu_model, tpu_model), ids, max_new_tokens=14)  # past the window (8)
    assert_steps_match(tpu_out, cpu_out)
    assert compiled_programs() == before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        misses = torch.tpu.cache_stats()["misses"]
        tpu_model.generate(ids.to("tpu"), max_new_tokens=30, do_sample=False)
    assert torch.tpu.cache_stats()["misses"] == misses  # no program per new length or token


def test_alibi_falcon_keeps_a_dynamic_cache_and_matches_cpu():
    """transformers' static cache breaks ALiBi Falcons (their bias and mask disagree in
    length; CPU raises too), so the device does not make it their default: CPU's tokens and
    logits, with the warning that each token compiles."""
    cpu_model = families.build("falcon (alibi)")
    cpu_model.generation_config.eos_token_id, cpu_model.generation_config.pad_token_id = None, 0
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    ids = torch.randint(0, families.VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    with pytest.warns(RuntimeWarning, match="DynamicCache compiles new programs"):
        cpu_out, tpu_out = generate_both((cpu_model, tpu_model), ids, max_new_tokens=4)
    assert_steps_match(tpu_out, cpu_out)


def test_a_decode_step_is_one_transfer_each_way_and_no_eager_program(models, monkeypatch):
    """Per generated token the host sends the forward's inputs in one transfer, reads back
    only the chosen token (the compiled step picks it; not the logits, nor the cache's
    length: the mask's offset comes from the host) and launches nothing but the compiled
    step: on a TPU host each transfer or extra program costs ~0.2-0.5 ms against a decode
    step of a few ms."""
    from tpu_backend import tensor as device_tensor

    _, tpu_model = models
    sent, read = [], []
    monkeypatch.setattr(
        device_tensor, "cpu_to_jax_many", lambda ts, f=device_tensor.cpu_to_jax_many: sent.append(len(ts)) or f(ts)
    )
    monkeypatch.setattr(
        device_tensor, "to_cpu_tensor", lambda t, f=device_tensor.to_cpu_tensor: read.append(tuple(t.shape)) or f(t)
    )
    ids = prompt(7).to("tpu")

    def launches(new_tokens: int):
        sent.clear(), read.clear()
        eager = torch.tpu.cache_stats()["requests"] + sum(device_tensor.EAGER_STORAGE_CALLS.values())
        tpu_model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        eager = torch.tpu.cache_stats()["requests"] + sum(device_tensor.EAGER_STORAGE_CALLS.values()) - eager
        return list(sent), list(read), eager

    launches(12)  # warm-up
    (short_sent, short_read, short_eager), (long_sent, long_read, long_eager) = launches(8), launches(24)
    more_sent, more_read = len(long_sent) - len(short_sent), len(long_read) - len(short_read)
    assert more_sent == long_sent.count(3) - short_sent.count(3) == 16, "per token, one transfer: id, position, mask"
    assert more_read == long_read.count((1, 1)) - short_read.count((1, 1)) == 16, "per token, its token only"
    assert long_eager == short_eager, f"{long_eager - short_eager} eager programs for 16 more tokens"


PROCESSORS = {
    "min_new_tokens": dict(min_new_tokens=10, eos_token_id=[3, 5], pad_token_id=0),
    "min_length": dict(min_length=15, eos_token_id=3, pad_token_id=0),
    "repetition_penalty": dict(repetition_penalty=1.3),
    "both": dict(min_new_tokens=6, repetition_penalty=1.5, eos_token_id=3, pad_token_id=0),
}


@pytest.mark.parametrize("processors", list(PROCESSORS))
def test_logits_processors_run_in_the_compiled_step_as_on_cpu(models, processors, monkeypatch):
    """min_new_tokens / min_length (end-of-sequence tokens suppressed by length, which the host
    knows) and repetition_penalty (the tokens seen, a mask on the device) are applied inside
    the compiled decode step: CPU's tokens, raw logits and processed scores at every step, and
    per token no eager program and one read (its token), as without processors."""
    from tpu_backend import tensor as device_tensor

    options = dict(PROCESSORS[processors], max_new_tokens=16, output_scores=True, attention_mask=torch.ones(2, 7))
    ids = prompt(7, batch=2, seed=5)
    cpu_out, tpu_out = generate_both(models, ids, **options)
    assert_steps_match(tpu_out, cpu_out)
    assert_steps_match(tpu_out, cpu_out, "scores")  # (-inf where suppressed: equal infinities compare equal)
    _, tpu_model = models
    read = []
    monkeypatch.setattr(
        device_tensor, "to_cpu_tensor", lambda t, f=device_tensor.to_cpu_tensor: read.append(tuple(t.shape)) or f(t)
    )
    on_tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in PROCESSORS[processors].items()}

    def launches(new_tokens: int):
        read.clear()
        eager, programs = torch.tpu.cache_stats()["requests"], programs_compiled()
        tpu_model.generate(ids.to("tpu"), max_new_tokens=new_tokens, do_sample=False, **on_tpu)
        return torch.tpu.cache_stats()["requests"] - eager, len(read), programs_compiled() - programs

    launches(12)
    (short_eager, short_read, _), (long_eager, long_read, compiled) = launches(16), launches(24)
    assert long_eager == short_eager, f"{long_eager - short_eager} eager programs for 8 more tokens"
    assert long_read - short_read == 8 and compiled == 0


def test_a_float_attention_mask_is_kept_on_the_host_as_an_integer_one(models):
    """`attention_mask=torch.ones(...)` is float32: kept on the device, its growth and
    slicing were 5 eager programs a token; CPU's logits at every step."""
    ids, mask = prompt(7, seed=8), torch.ones(1, 7)
    cpu_out, tpu_out = generate_both(models, ids, attention_mask=mask, max_new_tokens=8)
    assert_steps_match(tpu_out, cpu_out)
    _, tpu_model = models

    def eager_programs(new_tokens: int) -> int:
        before = torch.tpu.cache_stats()["requests"]
        tpu_model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=new_tokens, do_sample=False)
        return torch.tpu.cache_stats()["requests"] - before

    eager_programs(12)
    assert eager_programs(24) == eager_programs(16)


def test_other_prompt_length_and_length_reuse_the_decode_program(models):
    """A new prompt length compiles nothing: a short prompt goes through the compiled decode
    step a token at a time (a prefill of its own would compile ~50 per-op programs per new
    length, 7.8 s on a v5e), and decoding reuses the step (the cache length is a bucket,
    128, for both calls)."""
    generate_both(models, prompt(7), max_new_tokens=12)
    before = programs_compiled()
    cpu_out, tpu_out = generate_both(models, prompt(5, seed=2), max_new_tokens=20)
    assert_steps_match(tpu_out, cpu_out)
    assert programs_compiled() == before
    assert hf_integration.cache_length(5 + 20) == hf_integration.cache_length(7 + 32) == 128


def test_the_cache_is_as_long_as_a_small_share_of_the_weight_reads_affords():
    """A decode step reads its whole static cache, so the cache a call gets is at least as
    long as CACHE_READ_SHARE (2%) of the step's weight reads affords, capped by the model's
    positions: the TinyLlama-1.1B shape in bfloat16 gets 1024 positions at batch 1 (a
    257-token generation after a 64-token one then needs no new decode program: on a v5e
    that compile stalled 28 s), the minimum bucket at batch 8."""
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    weights = sum(p.numel() * 2 for p in model.parameters()) - 32000 * 2048 * 2  # (but the input embedding)
    per_position = 2 * 22 * 4 * 64 * 2  # keys and values of 22 layers, 4 heads of 64, bfloat16
    assert 1024 <= 0.02 * weights / per_position < 2048
    assert [hf_integration.affordable_cache_length(model, b) for b in (1, 2, 8)] == [1024, 512, 128]
    assert hf_integration.cache_length(32 + 257, model, 1) == hf_integration.cache_length(32 + 64, model, 1) == 1024
    model.config.max_position_embeddings = 256
    del model._tpu_decode_weight_bytes
    assert hf_integration.affordable_cache_length(model, 1) == 256  # (capped by the model's positions)


def test_a_longer_generation_after_a_short_one_compiles_nothing_new():
    """A model whose weights dwarf its cache (a 65536-token vocabulary over 2 small layers)
    decodes 257 tokens after a 12-token call with the same programs, CPU's tokens."""
    config = transformers.LlamaConfig(
        vocab_size=65536, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    cpu_model = transformers.LlamaForCausalLM(config).eval()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    ids = torch.randint(0, 65536, (1, 7), generator=torch.Generator().manual_seed(3))
    tpu_model.generate(ids.to("tpu"), max_new_tokens=12, do_sample=False)
    assert hf_integration.affordable_cache_length(tpu_model, 1) == 512  # (7 + 257 tokens fit)
    before = programs_compiled()
    got = tpu_model.generate(ids.to("tpu"), max_new_tokens=257, do_sample=False)
    assert programs_compiled() == before
    assert torch.equal(got.cpu(), cpu_model.generate(ids, max_new_tokens=257, do_sample=False))


def test_a_long_prompts_head_goes_in_chunks_that_compile_once(models, monkeypatch):
    """Past `prompt_steps.MAX_TOKENS` tokens a prompt's head goes through the model eagerly
    in chunks of `CHUNK` tokens, and its last 1 to `CHUNK` tokens through the decode step.
    The chunks' per-op programs have the same shapes whatever the prompt's length, so a new
    long prompt compiles nothing (a prefill compiled its ~50 per-op programs for every new
    length: 7.8 s for a 1B Llama on a v5e, at every turn of a chat). CPU's tokens and logits
    at every step, with a left-padded row, greedy and in transformers' loop (beams)."""
    monkeypatch.setattr(prompt_steps, "MAX_TOKENS", 6)
    monkeypatch.setattr(prompt_steps, "CHUNK", 4)

    def padded(length: int) -> dict:
        ids = prompt(length, batch=2, seed=length)
        mask = torch.ones_like(ids)
        mask[1, :3] = 0
        return dict(ids=ids, attention_mask=mask, max_new_tokens=6)

    generate_both(models, **padded(7))  # (a chunk and 3 steps: the chunk's programs compile)
    before = programs_compiled()
    for length in (9, 13, 12, 6):  # (2 chunks and a step; 3 and a step; 2 and 4 steps; 6 steps)
        cpu_out, tpu_out = generate_both(models, **padded(length))
        assert_steps_match(tpu_out, cpu_out)
    assert programs_compiled() == before
    cpu_out, tpu_out = generate_both(models, **padded(11), num_beams=2)
    assert_steps_match(tpu_out, cpu_out)


@pytest.mark.parametrize("options", [dict(num_beams=3), dict(repetition_penalty=1.3)], ids=["beams", "processor"])
def test_transformers_loops_take_a_new_prompt_length_through_the_compiled_forward(models, options):
    """Beam search and a greedy call with a logits processor decode in transformers' own loop
    with its compiled forward; their prompt goes through that forward too: a new prompt
    length compiles nothing, and every step's logits are CPU's."""
    generate_both(models, prompt(7), max_new_tokens=4, **options)  # the warm-up: its decode program
    before = programs_compiled()
    cpu_out, tpu_out = generate_both(models, prompt(6, seed=7), max_new_tokens=6, **options)
    assert_steps_match(tpu_out, cpu_out)
    assert programs_compiled() == before


def test_a_cache_shaped_unlike_its_config_falls_back_to_the_models_prefill():
    """transformers' `_get_static_cache_init_shape` gives a multi-query Falcon 4 key/value
    heads where its attention writes 1: the first step's trace refuses the write, the cache
    goes back to unallocated and the model's own prefill runs, as on CPU."""
    cpu_model = families.build("falcon")
    cpu_model.generation_config.eos_token_id, cpu_model.generation_config.pad_token_id = None, 0
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    assert tpu_model._get_static_cache_init_shape()[0] != 1 and tpu_model.config.multi_query
    ids = torch.randint(0, families.VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    cpu_out, tpu_out = generate_both((cpu_model, tpu_model), ids, max_new_tokens=6)
    assert_steps_match(tpu_out, cpu_out)
    assert tpu_model._tpu_prompt_steps is False


@pytest.mark.slow  # a second batch size: its own prefill and decode programs
def test_batch_with_padding_matches_cpu(models):
    ids = prompt(6, batch=2, seed=3)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding, as batched generation needs
    cpu_out, tpu_out = generate_both(models, ids, attention_mask=mask, max_new_tokens=10, pad_token_id=0)
    assert_steps_match(tpu_out, cpu_out)


def test_end_of_sequence_stops_and_pads_as_on_cpu():
    """Greedy decoding reads each token one step late (the chip runs ahead of the host): rows
    that finish apart are padded as on CPU, the step launched past the last token leaves no
    trace (tokens, logits, the returned cache's length), and a streamer gets CPU's tokens."""
    models = tiny_llama(tie=False).eval(), tiny_llama(tie=False).eval().to("tpu")  # (the tied one repeats a token)
    ids = prompt(7, batch=2, seed=6)
    free_run = models[0].generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    eos = [free_run[0, 7 + 3].item(), free_run[1, 7 + 6].item()]  # row 0 ends at its 4th new token, row 1 at its 7th
    assert not set(eos) & set(free_run[:, 7 : 7 + 3].flatten().tolist()), "the test's rows must finish apart"
    options = dict(max_new_tokens=12, eos_token_id=eos, pad_token_id=0, attention_mask=torch.ones_like(ids))
    cpu_out, tpu_out = generate_both(models, ids, **options)
    assert cpu_out.sequences.shape[1] < 6 + 12, "the end-of-sequence token did not stop generation"
    assert_steps_match(tpu_out, cpu_out)
    assert tpu_out.cache.get_seq_length().item() == cpu_out.cache.get_seq_length() == cpu_out.sequences.shape[1] - 1

    class Collect(transformers.generation.BaseStreamer):
        def __init__(self):
            self.parts = []

        def put(self, value):
            self.parts.append(value.cpu().reshape(2, -1))

        def end(self):
            self.parts.append("end")

    streamed = []
    for model, device in zip(models, ("cpu", "tpu")):
        streamer = Collect()
        model.generate(ids.to(device), streamer=streamer, do_sample=False, **options)
        streamed.append(streamer.parts)
    assert streamed[1][-1] == "end" and len(streamed[1]) == len(streamed[0])
    assert torch.equal(torch.cat(streamed[1][:-1], dim=1), torch.cat(streamed[0][:-1], dim=1))


def test_beam_search_matches_cpu(models):
    cpu_out, tpu_out = generate_both(models, prompt(7, seed=4), max_new_tokens=8, num_beams=3, output_scores=True)
    assert_steps_match(tpu_out, cpu_out)
    torch.testing.assert_close(tpu_out.sequences_scores.cpu(), cpu_out.sequences_scores, **LOGITS_TOLERANCE)
    assert torch.equal(tpu_out.beam_indices.cpu(), cpu_out.beam_indices)


def test_assisted_decoding_matches_cpu(models):
    """Prompt lookup and an assistant model (candidates checked several tokens at a time,
    the cache cropped back): CPU's tokens and logits, from tpu inputs and from CPU inputs."""
    cpu_model, tpu_model = models
    repeats = prompt(10, seed=5)
    ids = torch.cat([repeats, repeats[:, :6]], dim=1)  # a prompt whose n-grams recur: lookups find candidates
    cpu_out, tpu_out = generate_both(models, ids, max_new_tokens=7, prompt_lookup_num_tokens=3)
    assert_steps_match(tpu_out, cpu_out)
    options = dict(max_new_tokens=4, do_sample=False)
    expected = cpu_model.generate(ids, assistant_model=cpu_model, **options)
    from_host = tpu_model.generate(ids, assistant_model=tpu_model, **options)
    assert from_host.device.type == "cpu" and torch.equal(from_host, expected)


def test_classifier_free_guidance_matches_cpu(models):
    """`guidance_scale`: its logits processor runs the model on the sequence so far, so the
    loop's bookkeeping stays on the device (on the host the processor's call mixed devices:
    "Expected all tensors to be on the same device"). CPU's tokens and scores."""
    ids, mask = prompt(7, batch=2, seed=3), torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0
    cpu_out, tpu_out = generate_both(
        models, ids, attention_mask=mask, max_new_tokens=5, guidance_scale=1.5, output_scores=True
    )
    assert_steps_match(tpu_out, cpu_out, field="scores")


def test_sampling_draws_from_cpu_scores(models):
    """Sampling with top-k, top-p and temperature: the processed scores match CPU's at every
    step, and every drawn token is one those scores allow. The draw itself runs on the host
    from torch's generator, so the same seed draws CPU's tokens."""
    options = dict(do_sample=True, top_k=20, top_p=0.9, temperature=0.7, max_new_tokens=16, output_scores=True)
    outputs = []
    for model, device in zip(models, ("cpu", "tpu")):
        torch.manual_seed(5)
        outputs.append(model.generate(prompt(7, seed=5).to(device), return_dict_in_generate=True, **options))
    cpu_out, tpu_out = outputs
    for step, (actual, expected) in enumerate(zip(tpu_out.scores, cpu_out.scores)):
        actual = actual.cpu()
        assert torch.equal(actual.isinf(), expected.isinf()), f"top-k/top-p kept other tokens at step {step}"
        finite = expected.isfinite()
        torch.testing.assert_close(actual[finite], expected[finite], **LOGITS_TOLERANCE, msg=f"scores at step {step}")
        token = tpu_out.sequences[0, 7 + step].item()
        assert actual[0, token].isfinite(), f"token {token} at step {step} was not allowed by the scores"
    assert torch.equal(tpu_out.sequences.cpu(), cpu_out.sequences)


def test_static_cache_compiled_decode_without_the_entry_point(models, monkeypatch):
    """`cache_implementation="static"`: transformers compiles the decode step with backend
    "tpu". The name resolves through the registration made at `import tpu_backend`, as on a
    host where the checkout is only on PYTHONPATH (no `torch_dynamo_backends` entry point)."""
    from torch._dynamo.backends import registry

    from tpu_backend.integrations import dynamo as forwarder

    monkeypatch.setattr(registry, "_COMPILER_FNS", {k: v for k, v in registry._COMPILER_FNS.items() if k != "tpu"})
    monkeypatch.setattr(registry, "_BACKENDS", {k: v for k, v in registry._BACKENDS.items() if k != "tpu"})
    monkeypatch.setattr(registry, "_lazy_import", lambda: None)  # no entry point discovery
    forwarder._register(registry)
    assert registry.lookup_backend("tpu") is forwarder.tpu
    cpu_model, tpu_model = models
    for compiled in ("_tpu_compiled_call", "_tpu_decode_step"):  # a fresh torch.compile through the name
        monkeypatch.delattr(tpu_model, compiled, raising=False)
    requests = tpu_compile.compile_stats().total().requests
    options = dict(max_new_tokens=12, cache_implementation="static", max_cache_len=128)  # (the default's shapes)
    cpu_out, tpu_out = generate_both(models, prompt(7), **options)
    assert_steps_match(tpu_out, cpu_out)
    assert tpu_compile.compile_stats().total().requests >= requests + 11  # every decode step ran a compiled program


def test_unsupported_cache_is_refused_naming_what_to_use(models):
    with pytest.raises(NotImplementedError, match=r"cache_implementation='quantized'.*'static'"):
        models[1].generate(prompt(7).to("tpu"), max_new_tokens=2, cache_implementation="quantized")


def test_generate_with_cpu_inputs_returns_cpu_tensors(models):
    out = models[1].generate(prompt(7), max_new_tokens=3, do_sample=False)
    assert out.device.type == "cpu"
    assert torch.equal(out, models[0].generate(prompt(7), max_new_tokens=3, do_sample=False))


def test_transformers_sees_the_integration():
    assert getattr(transformers.GenerationMixin.generate, "_tpu_aware", False)


def test_dynamic_cache_still_matches_cpu_and_warns_it_compiles_per_token(models):
    with pytest.warns(RuntimeWarning, match="DynamicCache compiles new programs for every generated token"):
        cpu_out, tpu_out = generate_both(models, prompt(7), max_new_tokens=3, cache_implementation="dynamic")
    assert_steps_match(tpu_out, cpu_out)


_WITHOUT_ENTRY_POINT = """
import importlib.metadata as metadata
import sys

entry_points = metadata.entry_points
metadata.entry_points = lambda **kw: (
    metadata.EntryPoints([]) if kw.get("group") == "torch_dynamo_backends" else entry_points(**kw)
)  # as on a host where the checkout is only on PYTHONPATH
import torch
import tpu_backend

assert "tpu_backend.compile" not in sys.modules  # registered without importing the compile package
double = torch.compile(lambda x: x * 2 + 1, backend="tpu")
print(double(torch.arange(3.0, device="tpu")).cpu().tolist())
from torch._dynamo.backends import registry
from tpu_backend.compile import backend

assert registry.lookup_backend("tpu") is backend.tpu
"""


@pytest.mark.slow  # a fresh process: imports take tens of seconds on a loaded CPU
def test_backend_name_resolves_in_a_process_without_the_entry_point():
    import subprocess
    import sys

    from tests.chip import child_env

    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_ENTRY_POINT], capture_output=True, text=True, env=child_env(), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[1.0, 3.0, 5.0]"


def tiny_t5() -> transformers.T5ForConditionalGeneration:
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4, decoder_start_token_id=0
    )
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).eval()


@pytest.mark.parametrize(
    "options", [{}, pytest.param({"num_beams": 3}, marks=pytest.mark.slow)], ids=["greedy", "beams"]
)
def test_encoder_decoder_matches_cpu_and_compiles_nothing_per_token(options):
    """An encoder-decoder model (T5) keeps its loop's bookkeeping on the host, as a
    decoder-only one does: its encoder runs on the device, on its inputs moved there. On
    the device the growing decoder ids compiled a concatenation, a copy and an end-of-sequence
    check for every new length (36 programs for tokens 13 to 24); now none after a warm-up.
    Tokens, every step's logits, and the mask of a padded row as on CPU."""
    cpu_model = tiny_t5()
    models = (cpu_model, copy.deepcopy(cpu_model).to("tpu"))
    ids = prompt(9, batch=2)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    cpu_out, tpu_out = generate_both(models, ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, **options)
    assert_steps_match(tpu_out, cpu_out)
    before = programs_compiled()
    cpu_out, tpu_out = generate_both(models, ids, attention_mask=mask, max_new_tokens=24, min_new_tokens=24, **options)
    assert programs_compiled() == before
    assert_steps_match(tpu_out, cpu_out)


def test_sources_of_other_lengths_reuse_the_encoder_decoders_programs():
    """An evaluation loop's sources vary in length. Every new length traced and compiled the
    decode step again (its static cross-attention cache is as long as the source; 3 s each
    for this tiny T5 on CPU), and from the 9th length on Dynamo gave up and decoded eagerly.
    The source is padded to a power of two with its mask 0 there: the lengths of one bucket
    compile nothing after the first, with CPU's tokens and logits at every step."""
    cpu_model = tiny_t5()
    models = (cpu_model, copy.deepcopy(cpu_model).to("tpu"))
    for length in (9, 12, 16, 5):  # (one bucket: 16)
        ids = prompt(length, batch=2, seed=length)
        mask = torch.ones_like(ids)
        mask[1, length - 3 :] = 0
        if length == 12:
            before = programs_compiled()
        cpu_out, tpu_out = generate_both(models, ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6)
        assert_steps_match(tpu_out, cpu_out)
    assert programs_compiled() == before


def test_a_source_is_padded_within_the_encoders_positions_and_not_for_experts():
    bart = transformers.BartConfig(max_position_embeddings=40)
    assert [hf_integration.source_length(n, bart) for n in (3, 16, 17, 33, 40, 41)] == [16, 16, 32, 40, 40, 41]
    t5 = transformers.T5Config()  # (relative positions: no limit)
    assert [hf_integration.source_length(n, t5) for n in (17, 600)] == [32, 1024]
    assert hf_integration._pads_exactly(t5)
    assert not hf_integration._pads_exactly(transformers.SwitchTransformersConfig(num_experts=4))
    assert not hf_integration._pads_exactly(transformers.BigBirdPegasusConfig(attention_type="block_sparse"))


def test_the_decode_steps_processors_compile_for_a_tpu():
    """The processors and the token choice of the compiled greedy step (a boolean scatter of
    the tokens seen, -inf where end-of-sequence is suppressed), exported through the device's
    lowering and compiled by libtpu for a v5e."""
    import tpu_backend
    from tests.helpers import compile_for_tpu
    from tpu_backend.integrations import greedy_decoding

    def step_tail(logits, seen, suppressed, penalty, unfinished, pad, eos):
        scores = greedy_decoding.processed_scores(logits, penalty, True, suppressed, seen)
        tokens, unfinished = greedy_decoding.choose_next_tokens(scores, unfinished, pad, eos)
        return tokens, unfinished, scores, seen.scatter(1, tokens[:, None], True)

    vocab = 256
    args = (torch.randn(2, vocab), torch.zeros(2, vocab, dtype=torch.bool), torch.arange(vocab) == 3)
    args += (torch.tensor(1.3), torch.ones(2, dtype=torch.bool), torch.tensor(0), torch.tensor([3]))
    exported = tpu_backend.export(step_tail, args, platforms=("tpu",))
    compile_for_tpu(exported.call, *exported.in_avals, chip="v5e")
