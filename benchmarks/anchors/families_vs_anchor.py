"""Model families through our exporters and through the reference converter's examples
(litert-torch 0.10.0, `generative/examples/<family>`), side by side: error against the
framework's own forward, file size, latency, conversion seconds.

Each family is a small random-weight model built here from a config (seeded; nothing is
downloaded) and saved to a temporary folder in the layout the anchor's example loads;
the anchor converts it in its own environment (`anchor_families.py`, one subprocess per
family). Both .tflite files are then run in this process by the LiteRT interpreter
(XNNPACK, 1 thread) on the same inputs:

- error: max relative (`runtimes.litert.max_relative_error`) of each file's output
  against the framework model's forward in PyTorch (transformers / diffusers), the max
  over the family's input sets;
- latency: median ms of one call, the two files' calls interleaved ABBA (`--clock cpu`:
  thread CPU time, robust to other processes on a shared machine);
- conversion seconds: ours `export_*`/`convert` without its own LiteRT verification
  (the anchor verifies nothing), the anchor's `litert_torch.convert` after its model
  is built and loaded (its import is reported apart).

    python -m benchmarks.anchors.families_vs_anchor --anchor-python /tmp/anchor-venv/bin/python
    python -m benchmarks.anchors.families_vs_anchor --anchor-python ... --families embedding_gemma --json out.json

Without --anchor-python only our side is measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from benchmarks import anchors, harness
from benchmarks.harness import CLOCKS, interleaved, machine, round_ratio, write_json
from runtimes.litert import LiteRTModel, max_relative_error


@dataclass
class Family:
    """One family's comparison: `build()` returns the framework model(s); `save(models,
    folder)` writes what the anchor's example loads; `ours(models)` our EdgeModel;
    `cases(models)` the input sets as (our call, the anchor's call, the framework's
    outputs), a call being `fn(runtime) -> outputs` (e.g. `single(inputs)`: one run of
    the file's only signature, or an encode and decode steps)."""

    name: str
    anchor_example: str
    build: Callable
    save: Callable
    ours: Callable
    cases: Callable
    seq_len: int = 0
    anchor_family: str = ""  # anchor_families.py's name, if not `name`
    requires: str = ""  # a module of ours the family needs (skipped, said so, if absent)


def single(inputs: list, key: str | None = None) -> Callable:
    """A call running signature `key` (the only one if None) of a file on `inputs`."""
    return lambda runtime: runtime.run(inputs, key)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _edge(runtime):
    """What the generation helpers read of an EdgeModel: its runtime."""
    return SimpleNamespace(runtime=runtime)


def _save_safetensors(tensors: dict, path: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, path)


# ---- EmbeddingGemma ------------------------------------------------------------------------
# The anchor's model fixes the layout: 5 sliding + 1 global layer per 6 (it takes the global
# rotary base from layer 5), one kv head, query scale 1/sqrt(head_dim), a 2x4 dense head.
GEMMA_SEQ = 32


def build_embedding_gemma():
    import transformers

    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=2048,
        hidden_size=192,
        intermediate_size=384,
        num_hidden_layers=6,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=64,
        query_pre_attn_scalar=64,
        max_position_embeddings=512,
        sliding_window=512,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        use_bidirectional_attention=True,
    )
    model = _quiet(transformers.Gemma3TextModel, config).eval()
    head = torch.nn.Sequential(torch.nn.Linear(192, 768, bias=False), torch.nn.Linear(768, 192, bias=False)).eval()
    return model, head


def save_embedding_gemma(models, folder: str) -> None:
    """A sentence-transformers checkpoint folder: the body, then 2_Dense and 3_Dense."""
    model, head = models
    model.save_pretrained(folder)
    _save_safetensors({"linear.weight": head[0].weight}, os.path.join(folder, "2_Dense", "model.safetensors"))
    _save_safetensors({"linear.weight": head[1].weight}, os.path.join(folder, "3_Dense", "model.safetensors"))


def ours_embedding_gemma(models, verify: bool = False):
    from litert_torch.generative import export_embedder

    model, head = models
    return export_embedder(model, pooling="mean", head=head, max_len=GEMMA_SEQ, verify=verify, progress=False)


def ours_embedding_gemma_static(models):
    """Diagnostic, not an API: our converter on the same embedder at the anchor's fixed
    shape (1, GEMMA_SEQ), traced with a padded mask (an all-ones one lets transformers
    drop the mask from the graph)."""
    from litert_torch.generative.embedder import SentenceEmbedder
    from litert_torch.signatures import signature

    model, head = models
    ids = torch.ones(1, GEMMA_SEQ, dtype=torch.long)
    mask = (torch.arange(GEMMA_SEQ) < GEMMA_SEQ // 2).long()[None]
    embedder = SentenceEmbedder(model, "mean", True, head).eval()
    return signature("embed", embedder, (ids, mask), output_names=["embeddings"]).convert(progress=False)


def embedding_reference(model, head, ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """transformers on the unpadded sentence, mean-pooled, the dense head, L2-normalised."""
    kept = ids[:, mask[0].bool()]
    with torch.no_grad():
        hidden = model(input_ids=kept, attention_mask=torch.ones_like(kept), use_cache=False).last_hidden_state
        return torch.nn.functional.normalize(head(hidden.mean(1)), dim=-1).numpy()


def embedding_cases(models):
    model, head = models
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, model.config.vocab_size, (1, GEMMA_SEQ), generator=gen)
    cases = []
    for length in (GEMMA_SEQ, GEMMA_SEQ - 9):  # full, and padded at the end
        mask = (torch.arange(GEMMA_SEQ) < length).long()[None]
        inputs = [ids.numpy(), mask.numpy()]
        cases.append((single(inputs), single(inputs), [embedding_reference(model, head, ids, mask)]))
    return cases


# ---- Stable Diffusion pieces ---------------------------------------------------------------
# examples/stable_diffusion.py's sizes (SD 1.x layout, small); the anchor's CLIP adds all
# 77 positions, so the prompt is 77 ids as diffusers pads it.
SD_TEXT_LEN = 77


def build_sd_text_encoder():
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(0)
    config = CLIPTextConfig(
        vocab_size=4096,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=SD_TEXT_LEN,
        bos_token_id=4094,
        eos_token_id=4095,
        pad_token_id=4095,
    )
    return (_quiet(CLIPTextModel, config).eval(),)


def save_sd_text_encoder(models, folder: str) -> None:
    """The single-file SD 1.x checkpoint holds the CLIPTextModel under cond_stage_model.transformer."""
    (model,) = models
    model.config.to_json_file(os.path.join(folder, "config.json"))
    # transformers 5 names the CLIPTextModel's weights without the "text_model." of v4, with
    # which the SD 1.x checkpoints were written
    state = {
        "cond_stage_model.transformer." + (k if k.startswith("text_model.") else f"text_model.{k}"): v
        for k, v in model.state_dict().items()
    }
    _save_safetensors(state, os.path.join(folder, "sd.safetensors"))


def ours_sd_text_encoder(models):
    from litert_torch.generative.diffusion import TextEncoder
    from litert_torch.signatures import signature

    (model,) = models
    ids = torch.zeros((1, SD_TEXT_LEN), dtype=torch.int32)
    return signature("encode_text", TextEncoder(model), (ids,), output_names=["text_embeddings"]).convert(
        progress=False
    )


def sd_text_cases(models):
    (model,) = models
    gen = torch.Generator().manual_seed(1)
    cases = []
    for length in (SD_TEXT_LEN, 12):  # a full prompt; a short one padded with the end token
        ids = torch.full((1, SD_TEXT_LEN), model.config.eos_token_id, dtype=torch.int32)
        ids[0, 0] = model.config.bos_token_id
        ids[0, 1:length] = torch.randint(0, 4000, (length - 1,), generator=gen, dtype=torch.int32)
        with torch.no_grad():
            expected = model(ids).last_hidden_state.numpy()
        cases.append((single([ids.numpy()]), single([ids.numpy()]), [expected]))
    return cases


def build_sd_vae_decoder():
    import diffusers

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(32, 64, 64, 64),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1,
        norm_num_groups=32,
        sample_size=128,
    ).eval()
    return (vae,)


def save_sd_vae_decoder(models, folder: str) -> None:
    """diffusers' AutoencoderKL weights under first_stage_model., where the SD 1.x
    single-file checkpoint keeps its VAE (the anchor's name map reads that prefix)."""
    (vae,) = models
    vae.save_config(folder)
    state = {f"first_stage_model.{k}": v for k, v in vae.state_dict().items()}
    _save_safetensors(state, os.path.join(folder, "sd.safetensors"))


def ours_sd_vae_decoder(models):
    from litert_torch.generative.diffusion import LatentDecoder
    from litert_torch.signatures import signature

    (vae,) = models
    return signature(
        "decode_latents", LatentDecoder(vae), (torch.zeros(1, 4, 16, 16),), output_names=["image"]
    ).convert(progress=False)


def sd_vae_cases(models):
    from litert_torch.generative.diffusion import LatentDecoder

    (vae,) = models
    latents = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = LatentDecoder(vae)(latents).numpy()
    return [(single([latents.numpy()]), single([latents.numpy()]), [expected])]


def build_sd_unet():
    import diffusers

    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        in_channels=4,
        out_channels=4,
        layers_per_block=2,
        block_out_channels=(64, 128, 128, 128),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=128,
        attention_head_dim=8,
        norm_num_groups=32,
        sample_size=16,
    ).eval()
    return (unet,)


def save_sd_unet(models, folder: str) -> None:
    """diffusers' UNet weights under model.diffusion_model., where the SD 1.x single-file
    checkpoint keeps its UNet (the anchor's name map reads that prefix)."""
    (unet,) = models
    unet.save_config(folder)
    state = {f"model.diffusion_model.{k}": v for k, v in unet.state_dict().items()}
    _save_safetensors(state, os.path.join(folder, "sd.safetensors"))


SD_UNET_SAMPLE = 16  # latents 16x16: a 128x128 image


def ours_sd_unet(models):
    from litert_torch.generative.diffusion import GuidedDenoiser
    from litert_torch.signatures import signature

    (unet,) = models
    args = (
        torch.zeros(1, 4, SD_UNET_SAMPLE, SD_UNET_SAMPLE),
        torch.tensor([500.0]),
        torch.zeros(2, SD_TEXT_LEN, 128),
        torch.tensor([7.5]),
    )
    return signature("denoise", GuidedDenoiser(unet), args, output_names=["noise_pred"]).convert(progress=False)


def _no_anchor_call(runtime):
    raise NotImplementedError("the anchor's UNet call is not written: its loader does not take diffusers' weights")


def sd_unet_cases(models):
    from litert_torch.generative.diffusion import GuidedDenoiser

    (unet,) = models
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 4, SD_UNET_SAMPLE, SD_UNET_SAMPLE, generator=gen)
    context = torch.randn(2, SD_TEXT_LEN, 128, generator=gen)
    args = (latents, torch.tensor([500.0]), context, torch.tensor([7.5]))
    with torch.no_grad():
        expected = GuidedDenoiser(unet)(*args).numpy()
    return [(single([a.numpy() for a in args]), _no_anchor_call, [expected])]


# ---- T5 ------------------------------------------------------------------------------------
# The anchor's example is T5 v1.0 (ReLU feed-forward, tied embeddings); its decode signature
# takes the encoder's hidden states and one token, with no cache in or out.
T5_SOURCE, T5_CACHE = 64, 16


def build_t5():
    import transformers

    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=512,
        d_model=128,
        d_kv=32,
        d_ff=256,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="relu",
        tie_word_embeddings=True,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return (_quiet(transformers.T5ForConditionalGeneration, config).eval(),)


def save_t5(models, folder: str) -> None:
    models[0].save_pretrained(folder)


def ours_t5(models):
    from litert_torch.generative.seq2seq import export_seq2seq  # branch encdec, merged into main

    return export_seq2seq(models[0], source_len=T5_SOURCE, cache_len=T5_CACHE, verify=False, progress=False)


def t5_ours_call(source: np.ndarray, decoder_ids: list[int]) -> Callable:
    """encode, then decode over `decoder_ids` with the cache carried: the last step's logits."""

    def call(runtime):
        ids = np.zeros((1, T5_SOURCE), np.int32)
        mask = np.zeros((1, T5_SOURCE), np.int32)
        ids[0, : source.size], mask[0, : source.size] = source, 1
        cross = runtime.run([ids, mask], "encode")
        cache = [np.zeros(s.shape, s.dtype) for s in runtime.signature("decode").inputs if s.name.startswith("kv_")]
        for pos, token in enumerate(decoder_ids):
            step = [np.array([[token]], np.int32), np.array([pos], np.int32), *cache, *cross, mask]
            logits, *cache = runtime.run(step, "decode")
        return [logits[0, -1]]

    return call


def t5_anchor_call(source: np.ndarray, decoder_ids: list[int]) -> Callable:
    """The anchor's encode, then its decode on the last decoder token at its position (the
    signature has no cache: earlier tokens cannot be passed)."""

    def call(runtime):
        ids = np.zeros((1, T5_SOURCE), np.int32)
        ids[0, : source.size] = source
        pad_mask = np.where(np.arange(T5_SOURCE) < source.size, 0.0, -np.inf).astype(np.float32)
        (hidden,) = runtime.run([ids, np.arange(T5_SOURCE, dtype=np.int32), pad_mask], "encode")
        step = [hidden, np.array([[decoder_ids[-1]]], np.int32), np.array([len(decoder_ids) - 1], np.int32), pad_mask]
        (logits,) = runtime.run(step, "decode")
        return [logits.reshape(-1)]

    return call


def t5_cases(models, steps: int = 1):
    """The logits of decoder step `steps` after a 40-token source, against transformers'
    forward on the unpadded source (teacher-forced decoder ids)."""
    (model,) = models
    gen = torch.Generator().manual_seed(1)
    source = torch.randint(2, model.config.vocab_size, (40,), generator=gen)
    decoder_ids = [0] + torch.randint(2, model.config.vocab_size, (steps - 1,), generator=gen).tolist()
    with torch.no_grad():
        logits = model(input_ids=source[None], decoder_input_ids=torch.tensor([decoder_ids])).logits[0, -1]
    src = source.int().numpy()
    return [(t5_ours_call(src, decoder_ids), t5_anchor_call(src, decoder_ids), [logits.numpy()])]


# ---- PaliGemma 2 -----------------------------------------------------------------------------
# The anchor's example at its own test size (paligemma.get_fake_model_config with decoder2's
# fake decoder), mirrored here as a transformers PaliGemma 2 (Gemma 2 text, SigLIP vision).
# Prompt: 16 image tokens, then 8 text tokens (the prefix); then decode steps.
PG_IMAGE, PG_TEXT, PG_STEPS, PG_CACHE = 127, 8, 4, 64


def build_paligemma():
    import transformers

    torch.manual_seed(0)
    text = dict(
        model_type="gemma2",
        vocab_size=128,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        max_position_embeddings=256,
    )
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=1152,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=16,
        image_size=8,
        patch_size=2,
    )
    config = transformers.PaliGemmaConfig(
        text_config=text, vision_config=vision, image_token_index=PG_IMAGE, projection_dim=128
    )
    model = _quiet(transformers.PaliGemmaForConditionalGeneration, config).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # larger weights, so that the logits are not all alike (as test_vlm does)
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, 0.3, generator=gen)
    return (model,)


def save_paligemma(models, folder: str) -> None:
    """save_pretrained, the vision tower's weights renamed to the hub checkpoints' layout
    (vision_tower.vision_model.*, transformers 4), which the anchor's name map reads;
    transformers 5 writes vision_tower.* (the anchor then fails on
    'vision_tower.vision_model.embeddings.patch_embedding.weight')."""
    from safetensors.torch import load_file

    models[0].save_pretrained(folder)
    path = os.path.join(folder, "model.safetensors")
    state = load_file(path)
    renamed = {
        ("vision_tower.vision_model." + k[len("vision_tower.") :] if k.startswith("vision_tower.") else k): v
        for k, v in state.items()
    }
    _save_safetensors(renamed, path)


def ours_paligemma(models):
    from litert_torch.generative import export_vlm

    return export_vlm(models[0], prefill_len=32, cache_len=PG_CACHE, verify=False, progress=False)


def _decode_steps(runtime, ids: np.ndarray, start: int, cache: dict | list, by_name: bool) -> list:
    """Teacher-forced decode of ids[start:] at their positions: the logits rows."""
    rows = []
    for pos in range(start, ids.size):
        token, position = np.array([[ids[pos]]], np.int32), np.array([pos], np.int32)
        if by_name:  # the anchor's signature: inputs and outputs by name
            sig = runtime.signature("decode")
            feed = {"tokens": token, "input_pos": position, **cache}
            outputs = dict(zip(sig.output_names, runtime.run([feed[t.name] for t in sig.inputs], "decode")))
            cache = {k: v for k, v in outputs.items() if k != "logits"}
            rows.append(outputs["logits"].reshape(-1))
        else:
            logits, *cache = runtime.run([token, position, *cache], "decode")
            rows.append(logits.reshape(-1))
    return rows


def paligemma_ours_call(ids: np.ndarray, pixels: np.ndarray) -> Callable:
    from litert_torch.generative import vlm

    def call(runtime):
        cache = vlm.prefill_prompt(_edge(runtime), pixels, ids[: 16 + PG_TEXT], PG_IMAGE)
        return _decode_steps(runtime, ids, 16 + PG_TEXT, cache, by_name=False)

    return call


def paligemma_anchor_call(ids: np.ndarray, pixels: np.ndarray) -> Callable:
    """prefill_{PG_TEXT}_pixel over the whole prompt (its image embeddings replace the first
    16 positions; the chunk attends both ways), then decode."""

    def call(runtime):
        return _anchor_pixel_prefill_and_decode(runtime, f"prefill_{PG_TEXT}_pixel", ids, 16 + PG_TEXT, pixels)

    return call


def _anchor_pixel_prefill_and_decode(runtime, key: str, ids: np.ndarray, n: int, pixels: np.ndarray) -> list:
    """The anchor's VLM protocol: its `*_pixel` prefill signature over ids[:n] with the image
    (its other inputs zero), then decode steps over the rest of `ids`."""
    sig = runtime.signature(key)
    feed = {"tokens": ids[None, :n].astype(np.int32), "input_pos": np.arange(n, dtype=np.int32), "pixel_values": pixels}
    inputs = [feed[t.name] if t.name in feed else np.zeros(t.shape, t.dtype) for t in sig.inputs]
    cache = dict(zip(sig.output_names, runtime.run(inputs, key)))
    return _decode_steps(runtime, ids, n, cache, by_name=True)


def paligemma_cases(models):
    from litert_torch.generative import vlm

    (model,) = models
    gen = torch.Generator().manual_seed(1)
    text = [2] + torch.randint(3, 100, (PG_TEXT - 2,), generator=gen).tolist() + [108 % 127]  # bos, words, "\n"
    rest = torch.randint(3, 100, (PG_STEPS,), generator=gen).tolist()
    ids = np.array([PG_IMAGE] * 16 + text + rest, np.int32)
    pixels = torch.randn(1, 3, 8, 8, generator=gen)
    with torch.no_grad():
        logits = vlm.reference_forward(model, torch.from_numpy(ids)[None], pixels, prompt_len=16 + PG_TEXT)[0]
    expected = list(logits[16 + PG_TEXT :].numpy())
    px = pixels.numpy()
    return [(paligemma_ours_call(ids, px), paligemma_anchor_call(ids, px), expected)]


# ---- Qwen 2.5 VL ----------------------------------------------------------------------------
# The test's tiny Qwen2.5-VL (benchmarks/families/qwen_vl.py: text width 64, vision width 32,
# 2 x 2 windows and a full-attention block) with tied embeddings, as the example's name map
# (Qwen2.5-VL-3B's) expects. The example puts the image right after the first token, so the
# prompt is: vision start, the image's 6 tokens (a 4 x 6 grid of patches, 16 x 24 pixels),
# vision end, text; then decode steps.
QV_GRID, QV_TEXT, QV_STEPS, QV_CACHE = (1, 4, 6), 8, 4, 64


def build_qwen_vl():
    from benchmarks.families import qwen_vl as tiny

    return (tiny.qwen2_5_vl(tie_word_embeddings=True),)


def save_qwen_vl(models, folder: str) -> None:
    """save_pretrained (transformers 5 writes the hub layout, model.layers.* and visual.*),
    and the image's (height, width) in pixels, which the example takes as a flag."""
    models[0].save_pretrained(folder)
    patch = models[0].config.vision_config.patch_size
    Path(folder, "image_size.json").write_text(json.dumps([QV_GRID[1] * patch, QV_GRID[2] * patch]))


def ours_qwen_vl(models):
    from litert_torch.generative import export_vlm

    return export_vlm(models[0], grids=[QV_GRID], prefill_len=16, cache_len=QV_CACHE, verify=False, progress=False)


def qwen_vl_ours_call(ids: np.ndarray, image: np.ndarray, n: int) -> Callable:
    """encode_image_4x6, prefill of ids[:n] with their rotary positions, then decode."""
    from benchmarks.families.qwen_vl import IMAGE
    from litert_torch.generative import qwen_vl

    def call(runtime):
        cache, rope = qwen_vl.prefill_prompt(_edge(runtime), image, ids[: n + 1], IMAGE)
        rows = []
        for pos in range(n, ids.size):
            step = [np.array([[ids[pos]]], np.int32), np.array([pos], np.int32), *rope(pos)]
            logits, *cache = runtime.run([*step, *cache], "decode")
            rows.append(logits.reshape(-1))
        return rows

    return call


def qwen_vl_anchor_call(ids: np.ndarray, image: np.ndarray, n: int, sizes: tuple[int, int, int]) -> Callable:
    """The image's patches (made on the host, as ours: `sizes` are patch, merge and temporal
    patch), prefill_{n - image tokens}_pixel over ids[:n] (its image rows replace the
    positions after the first), then decode."""
    from litert_torch.generative import qwen_vl

    def call(runtime):
        key = next(s.key for s in runtime.signatures if s.key.endswith("_pixel"))
        patches, _ = qwen_vl.patchify(image, *sizes)
        return _anchor_pixel_prefill_and_decode(runtime, key, ids, n, patches)

    return call


def qwen_vl_cases(models):
    from benchmarks.families import qwen_vl as tiny
    from litert_torch.generative import qwen_vl

    (model,) = models
    vision = model.config.vision_config
    gen = torch.Generator().manual_seed(1)
    words = torch.randint(0, tiny.START, (QV_TEXT + QV_STEPS,), generator=gen).tolist()
    image_ids = [tiny.IMAGE] * qwen_vl.image_tokens(model, QV_GRID)
    ids = np.array([tiny.START, *image_ids, tiny.END, *words], np.int32)
    n = len(ids) - QV_STEPS  # the prompt
    image = tiny.image(QV_GRID).numpy()
    sizes = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
    patches, grid = qwen_vl.patchify(image, *sizes)
    with torch.no_grad():
        logits = qwen_vl.reference_forward(model, torch.from_numpy(ids)[None], torch.from_numpy(patches), [grid])[0]
    expected = list(logits[n:].numpy())
    return [(qwen_vl_ours_call(ids, image, n), qwen_vl_anchor_call(ids, image, n, sizes), expected)]


FAMILIES = {
    f.name: f
    for f in (
        Family(
            "embedding_gemma",
            "embedding_gemma",
            build_embedding_gemma,
            save_embedding_gemma,
            ours_embedding_gemma,
            embedding_cases,
            seq_len=GEMMA_SEQ,
        ),
        Family(
            "embedding_gemma_static",
            "embedding_gemma",
            build_embedding_gemma,
            save_embedding_gemma,
            ours_embedding_gemma_static,
            embedding_cases,
            seq_len=GEMMA_SEQ,
            anchor_family="embedding_gemma",
        ),
        Family(
            "paligemma",
            "paligemma (v2, fake config)",
            build_paligemma,
            save_paligemma,
            ours_paligemma,
            paligemma_cases,
            seq_len=PG_TEXT,
        ),
        Family(
            "qwen_vl",
            "qwen_vl (Qwen 2.5 VL)",
            build_qwen_vl,
            save_qwen_vl,
            ours_qwen_vl,
            qwen_vl_cases,
            seq_len=QV_TEXT + 2,  # the prompt's text: vision start and end, QV_TEXT words
        ),
        Family(
            "t5",
            "t5 (multisig)",
            build_t5,
            save_t5,
            ours_t5,
            t5_cases,
            seq_len=T5_SOURCE,
            requires="litert_torch.generative.seq2seq",
        ),
        Family(
            "sd_text_encoder",
            "stable_diffusion (clip)",
            build_sd_text_encoder,
            save_sd_text_encoder,
            ours_sd_text_encoder,
            sd_text_cases,
            seq_len=SD_TEXT_LEN,
        ),
        Family("sd_unet", "stable_diffusion (diffusion)", build_sd_unet, save_sd_unet, ours_sd_unet, sd_unet_cases),
        Family(
            "sd_vae_decoder",
            "stable_diffusion (decoder)",
            build_sd_vae_decoder,
            save_sd_vae_decoder,
            ours_sd_vae_decoder,
            sd_vae_cases,
        ),
    )
}


# ---- measuring -----------------------------------------------------------------------------
def worst_error(runtime: LiteRTModel, cases, side: int) -> float:
    """Max relative error over the cases (`side` 0: our call, 1: the anchor's)."""
    return max(max_relative_error(case[side](runtime), case[2]) for case in cases)


def run_anchor(family: Family, folder: str, opts) -> dict:
    """The anchor's conversion of `folder` (anchor_families.py in its own environment):
    its report with "content", or {"error": ..., "stage": ...}."""
    out = os.path.join(folder, "anchor.tflite")
    command = [opts.anchor_python, anchors.script("anchor_families"), family.anchor_family or family.name, folder, out]
    command.append(str(family.seq_len))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # else it imports this repo's litert_torch
    proc = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:600], "stage": "run"}
    report = json.loads(lines[-1])
    if "error" not in report:
        report["content"] = Path(out).read_bytes()
    return report


def measure(family: Family, opts) -> dict:
    models = family.build()
    cases = family.cases(models)
    start = time.perf_counter()
    edge = family.ours(models)
    ours_s = time.perf_counter() - start
    ours_bytes = edge.model_content()
    ours_rt = LiteRTModel(ours_bytes, num_threads=1)
    row = dict(
        family=family.name,
        anchor_example=family.anchor_example,
        params=sum(p.numel() for m in models for p in m.parameters()),
        ours=dict(
            convert_s=ours_s,
            bytes=len(ours_bytes),
            rel_err=worst_error(ours_rt, cases, 0),
        ),
        anchor=None,
    )
    fns = [lambda: cases[0][0](ours_rt)]
    if opts.anchor_python:
        with tempfile.TemporaryDirectory() as folder:
            family.save(models, folder)
            anchor = run_anchor(family, folder, opts)
        if "error" not in anchor:
            content = anchor.pop("content")
            anchor_rt = LiteRTModel(content, num_threads=1)
            anchor.update(bytes=len(content), rel_err=worst_error(anchor_rt, cases, 1))
            fns.append(lambda: cases[0][1](anchor_rt))
        row["anchor"] = anchor
    samples = interleaved(fns, opts.runs, CLOCKS[opts.clock])
    row["ours"]["latency_ms"] = statistics.median(samples[0])
    if len(samples) > 1:
        anchor = row["anchor"]
        anchor["latency_ms"] = statistics.median(samples[1])
        anchor["latency_ratio"] = round_ratio(samples[0], samples[1])
        anchor["size_ratio"] = len(ours_bytes) / anchor["bytes"]
        anchor["convert_speedup"] = anchor["convert_s"] / ours_s
    return row


def table(rows: list[dict], clock: str) -> Table:
    title = (
        f"Ours vs litert-torch 0.10.0's examples (float32; error: max relative vs the framework; "
        f"latency: median {clock} ms, interleaved; ratios ours / anchor)"
    )
    columns = (
        "family",
        "anchor example",
        "params",
        "ours err",
        "anchor err",
        "ours KiB",
        "anchor KiB",
        "ours ms",
        "anchor ms",
        "latency ratio",
        "ours convert s",
        "anchor convert s",
    )
    t = harness.table(title, columns, labels=2)
    for r in rows:
        o, a = r["ours"], r["anchor"] or {}
        if "error" in a:
            anchor_cells = [f"failed ({a['stage']}): {a['error']}"] + [""] * 4
        elif a:
            anchor_cells = [
                f"{a['rel_err']:.1e}",
                f"{a['bytes'] / 1024:.0f}",
                f"{a['latency_ms']:.3f}",
                f"{a['latency_ratio']:.2f}",
                f"{a['convert_s']:.2f}",
            ]
        else:
            anchor_cells = ["-"] * 5
        t.add_row(
            r["family"],
            r["anchor_example"],
            f"{r['params'] / 1e6:.2f}M",
            f"{o['rel_err']:.1e}",
            anchor_cells[0],
            f"{o['bytes'] / 1024:.0f}",
            anchor_cells[1],
            f"{o['latency_ms']:.3f}",
            anchor_cells[2],
            anchor_cells[3],
            f"{o['convert_s']:.2f}",
            anchor_cells[4],
        )
    return t


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, from {list(FAMILIES)}")
    parser.add_argument("--anchor-python", help="python of the litert-torch 0.10.0 environment (benchmarks/README.md)")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--json", help="write every figure here")
    opts = parser.parse_args(argv)
    names = [n.strip() for n in opts.families.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {list(FAMILIES)}")
    torch.set_num_threads(1)
    console = Console(width=240)
    rows = []
    for name in names:
        needed = FAMILIES[name].requires
        if needed and importlib.util.find_spec(needed) is None:
            console.print(f"[yellow]{name}: skipped, this checkout has no {needed}[/yellow]")
            continue
        console.print(f"[dim]{name}...[/dim]")
        rows.append(measure(FAMILIES[name], opts))
    console.print(table(rows, opts.clock))
    if opts.json:
        settings = dict(runs=opts.runs, clock=opts.clock, anchor_python=opts.anchor_python)
        write_json(opts.json, dict(rows=rows, settings=settings, environment=machine()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
