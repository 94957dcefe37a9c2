"""Convert one model family with the reference converter's own example (litert-torch
0.10.0, `litert_torch.generative.examples.<family>`), in the anchor's environment, from
a folder of weights saved by transformers / diffusers. Prints one JSON line: import and
conversion seconds, the .tflite path and the input names it was traced with; on a
failure {"error": the exception, "stage": where}. Called by families_vs_anchor.py;
imports nothing from this repository.

    /tmp/anchor-venv/bin/python benchmarks/anchors/anchor_families.py FAMILY MODEL_DIR OUT.tflite SEQ_LEN

Each example builds its model from a hard-coded full-size configuration (e.g.
EmbeddingGemma-300M: 24 layers, width 768) and loads a checkpoint into it with a
tensor-name map. For a small random-weight model the configuration function is replaced
by the same structure at the saved config's sizes (read from its config.json); the model
class, the loader and its name map are the example's own.

FAMILY:
  embedding_gemma  examples/embedding_gemma: build_model(folder) on a Gemma3TextModel
                   checkpoint plus the sentence-transformers 2_Dense / 3_Dense folders
  sd_text_encoder  examples/stable_diffusion: clip.CLIP + ClipModelLoader on a
                   single-file checkpoint (the CLIPTextModel under cond_stage_model.transformer.)
  t5               examples/t5: T5Encoder / T5Decoder with the example's name map, as
                   convert_t5_to_tflite_multisig converts them (encode, decode), float
  paligemma        examples/paligemma: build_model(version=2) at the example's fake
                   (test) config, converted by its converter.convert_to_tflite
                   (prefill_SEQ_LEN_pixel, decode); seconds include building and loading
  qwen_vl          examples/qwen_vl: build_model at the checkpoint's sizes (Qwen2.5-VL,
                   tied embeddings) for one image of image_size.json's pixels, converted
                   by converter.convert_to_tflite as its convert_to_tflite.py does
                   (prefill_SEQ_LEN, prefill_SEQ_LEN_pixel, decode); seconds include
                   building and loading
  sd_unet          examples/stable_diffusion: diffusion.Diffusion + DiffusionModelLoader
                   on diffusers' saved UNet2DConditionModel (keys under model.diffusion_model.)
  sd_vae_decoder   examples/stable_diffusion: decoder.Decoder + AutoEncoderModelLoader
                   on diffusers' saved AutoencoderKL (keys under first_stage_model.)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback

# the same shim as the decoder comparison's (this folder is on sys.path when run as a script)
from anchor_generative import _tensorflow_schema_shim


def _config(folder: str) -> dict:
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


def _rope_theta(hf: dict, layer_type: str, default: float) -> float:
    """transformers 5 keeps Gemma 3's two rotary bases in rope_parameters per layer type."""
    params = hf.get("rope_parameters") or {}
    if layer_type in params:
        return float(params[layer_type].get("rope_theta", default))
    key = "rope_local_base_freq" if layer_type == "sliding_attention" else "rope_theta"
    return float(hf.get(key, default))


def embedding_gemma_config(folder: str):
    """EmbeddingGemma's structure (example's get_model_config) at the checkpoint's sizes."""
    import safetensors.torch

    from litert_torch.generative.layers import model_config as cfg

    hf = _config(folder)
    dense = safetensors.torch.load_file(os.path.join(folder, "2_Dense", "model.safetensors"))["linear.weight"]
    norm = cfg.NormalizationConfig(
        type=cfg.NormalizationType.RMS_NORM, epsilon=hf.get("rms_norm_eps", 1e-6), zero_centered=True
    )

    def block(layer_type: str):
        local = layer_type == "sliding_attention"
        attn = cfg.AttentionConfig(
            num_heads=hf["num_attention_heads"],
            head_dim=hf["head_dim"],
            num_query_groups=hf["num_key_value_heads"],
            rotary_base=_rope_theta(hf, layer_type, 10000.0 if local else 1e6),
            rotary_percentage=1.0,
            query_norm_config=norm,
            key_norm_config=norm,
            sliding_window_size=hf["sliding_window"] if local else None,
            attn_type=cfg.AttentionType.LOCAL_SLIDING if local else cfg.AttentionType.GLOBAL,
            qkv_transpose_before_split=True,
        )
        ff = cfg.FeedForwardConfig(
            type=cfg.FeedForwardType.GATED,
            activation=cfg.ActivationConfig(cfg.ActivationType.GELU_TANH),
            intermediate_size=hf["intermediate_size"],
            pre_ff_norm_config=norm,
            post_ff_norm_config=norm,
        )
        return cfg.TransformerBlockConfig(
            attn_config=attn,
            ff_config=ff,
            pre_attention_norm_config=norm,
            post_attention_norm_config=norm,
            parallel_residual=False,
        )

    width = hf["hidden_size"]
    return cfg.ModelConfig(
        vocab_size=hf["vocab_size"],
        num_layers=hf["num_hidden_layers"],
        max_seq_len=hf["max_position_embeddings"],
        embedding_dim=width,
        embedding_scale=width**0.5,
        block_configs=[block(t) for t in hf["layer_types"]],
        final_norm_config=norm,
        dense_intermediate_size=dense.shape[0],
    )


def embedding_gemma(folder: str, seq_len: int):
    import torch

    from litert_torch.generative.examples.embedding_gemma import embedding_gemma as example

    config = embedding_gemma_config(folder)
    example.get_model_config = lambda: config  # build_model reads it; the rest is the example's
    model = example.build_model(folder).eval()
    # the example's convert_to_tflite: tokens and attention_mask, int64, batch 1
    sample = (torch.ones(1, seq_len, dtype=torch.long), torch.ones(1, seq_len, dtype=torch.long))
    return [("serving_default", model, sample)]


def sd_text_encoder(folder: str, seq_len: int):
    import torch

    from litert_torch.generative.examples.stable_diffusion import clip
    from litert_torch.generative.layers import model_config as cfg
    from litert_torch.generative.utilities import stable_diffusion_loader

    hf = _config(folder)
    if hf["max_position_embeddings"] != seq_len:
        raise ValueError(f"the example's CLIP adds all {hf['max_position_embeddings']} positions; seq_len {seq_len}")
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    attn = cfg.AttentionConfig(
        num_heads=heads,
        head_dim=width // heads,
        num_query_groups=heads,
        rotary_base=0,
        rotary_percentage=0.0,
        qkv_use_bias=True,
        qkv_transpose_before_split=True,
        qkv_fused_interleaved=False,
        output_proj_use_bias=True,
        enable_kv_cache=False,
    )
    ff = cfg.FeedForwardConfig(
        type=cfg.FeedForwardType.SEQUENTIAL,
        activation=cfg.ActivationConfig(cfg.ActivationType.GELU_QUICK),
        intermediate_size=hf["intermediate_size"],
        use_bias=True,
    )
    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.LAYER_NORM, enable_hlfb=False)
    config = cfg.ModelConfig(
        vocab_size=hf["vocab_size"],
        num_layers=hf["num_hidden_layers"],
        max_seq_len=hf["max_position_embeddings"],
        embedding_dim=width,
        block_configs=cfg.TransformerBlockConfig(
            attn_config=attn, ff_config=ff, pre_attention_norm_config=norm, post_attention_norm_config=norm
        ),
        final_norm_config=norm,
    )
    model = clip.CLIP(config)
    loader = stable_diffusion_loader.ClipModelLoader(os.path.join(folder, "sd.safetensors"), clip.TENSOR_NAMES)
    loader.load(model, strict=False)
    return [("encode", model.eval(), (torch.zeros((1, seq_len), dtype=torch.int),))]


def sd_vae_decoder(folder: str, seq_len: int):
    import torch

    from litert_torch.generative.examples.stable_diffusion import decoder
    from litert_torch.generative.utilities import stable_diffusion_loader

    hf = _config(folder)
    model = decoder.Decoder(decoder.get_model_config(device_type="cpu"))
    loader = stable_diffusion_loader.AutoEncoderModelLoader(
        os.path.join(folder, "sd.safetensors"), decoder.TENSOR_NAMES
    )
    loader.load(model, strict=False)
    side = hf["sample_size"] // 2 ** (len(hf["block_out_channels"]) - 1)
    return [("decode", model.eval(), (torch.zeros((1, hf["latent_channels"], side, side)),))]


def t5_config(folder: str, seq_len: int):
    """The example's T5 (get_model_config_t5: t5-base, v1.0 layout) at the checkpoint's
    sizes, for sources of `seq_len` tokens (the example's converter uses 512)."""
    from litert_torch.generative.layers import model_config as cfg

    hf = _config(folder)
    attn = cfg.AttentionConfig(
        num_heads=hf["num_heads"],
        head_dim=hf["d_kv"],
        num_query_groups=hf["num_heads"],
        qkv_use_bias=False,
        relative_attention_num_buckets=hf["relative_attention_num_buckets"],
        relative_attention_max_distance=hf["relative_attention_max_distance"],
    )
    ff = cfg.FeedForwardConfig(
        type=cfg.FeedForwardType.SEQUENTIAL,
        activation=cfg.ActivationConfig(cfg.ActivationType.RELU),
        intermediate_size=hf["d_ff"],
    )
    norm = cfg.NormalizationConfig(
        type=cfg.NormalizationType.RMS_NORM, epsilon=hf["layer_norm_epsilon"], enable_hlfb=False
    )
    block = cfg.TransformerBlockConfig(
        attn_config=attn,
        relative_attention=True,
        ff_config=ff,
        pre_attention_norm_config=norm,
        post_attention_norm_config=norm,
    )
    return cfg.ModelConfig(
        vocab_size=hf["vocab_size"],
        num_layers=hf["num_layers"],
        max_seq_len=seq_len,
        embedding_dim=hf["d_model"],
        block_configs=block,
        final_norm_config=norm,
        lm_head_use_bias=False,
    )


def t5(folder: str, seq_len: int):
    """The example's two-signature conversion (convert_t5_to_tflite_multisig), float."""
    import torch

    from litert_torch.generative.examples.t5 import t5 as example

    config = t5_config(folder, seq_len)
    embedding = torch.nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=0)
    encoder = example.build_t5_encoder_model(config, embedding, folder).eval()
    decoder = example.build_t5_decoder_model(config, embedding, folder).eval()
    tokens = torch.zeros((1, seq_len), dtype=torch.int)
    positions = torch.arange(0, seq_len, dtype=torch.int)
    pad_mask = torch.zeros([seq_len], dtype=torch.float32)
    hidden = torch.zeros((1, seq_len, config.embedding_dim), dtype=torch.float32)
    token, position = torch.tensor([[1]], dtype=torch.int), torch.tensor([0], dtype=torch.int)
    return [
        ("encode", encoder, (tokens, positions, pad_mask)),
        ("decode", decoder, (hidden, token, position, pad_mask)),
    ]


def sd_unet(folder: str, seq_len: int):

    from litert_torch.generative.examples.stable_diffusion import diffusion
    from litert_torch.generative.utilities import stable_diffusion_loader

    model = diffusion.Diffusion(diffusion.get_model_config(batch_size=2, device_type="cpu"))
    loader = stable_diffusion_loader.DiffusionModelLoader(
        os.path.join(folder, "sd.safetensors"), diffusion.TENSOR_NAMES
    )
    loader.load(model, strict=False)
    raise NotImplementedError("the anchor's UNet loaded; its call is not written in families_vs_anchor.py")


PALIGEMMA_CACHE = 64


def paligemma(folder: str, seq_len: int):
    """The example's PaliGemma 2 at its own test size (get_fake_model_config with
    decoder2's fake decoder: width 128, 2 layers; SigLIP width 1152, 2 layers, 8x8 pixels
    in 2x2 patches), loaded with build_model(version=2); the checkpoint's config.json must
    have those sizes. Converted by the example's converter.convert_to_tflite (float):
    prefill_{seq_len}_pixel and decode signatures, cache PALIGEMMA_CACHE. Returns the path."""
    import glob
    import tempfile

    import torch

    from litert_torch.generative.examples.paligemma import decoder2
    from litert_torch.generative.examples.paligemma import paligemma as example
    from litert_torch.generative.utilities import converter, export_config

    example.get_model_config = lambda get_decoder_config: example.get_fake_model_config(
        decoder2.get_fake_decoder2_config
    )
    model = example.build_model(folder, version=2, mask_cache_size=PALIGEMMA_CACHE)  # as its flags give
    image = model.config.image_encoder_config.image_embedding
    hf = _config(folder)
    found = (hf["text_config"]["hidden_size"], hf["vision_config"]["hidden_size"], hf["vision_config"]["image_size"])
    wanted = (
        model.config.decoder_config.embedding_dim,
        model.config.image_encoder_config.embedding_dim,
        image.image_size,
    )
    if found != wanted:
        raise ValueError(f"config.json sizes {found} are not the example's fake config's {wanted}")
    out = tempfile.mkdtemp()
    converter.convert_to_tflite(
        model,
        output_path=out,
        output_name_prefix="paligemma",
        prefill_seq_len=seq_len,
        kv_cache_max_len=PALIGEMMA_CACHE,
        pixel_values_size=torch.Size([1, image.channels, image.image_size, image.image_size]),
        pixel_seq_len=(image.image_size // image.patch_size) ** 2,
        quantize="none",
        config=model.config.decoder_config,
        export_config=export_config.ExportConfig(),
    )
    (path,) = glob.glob(os.path.join(out, "*.tflite"))
    return path


QWEN_VL_CACHE = 64


def qwen_vl_config(folder: str):
    """The example's Qwen 2.5 VL (get_model_config: 3B, 476 x 644 pixels) at the checkpoint's
    sizes, for one image of the (height, width) in the folder's image_size.json. The
    decoder's embedding and output weights are tied, as the example's name map expects."""
    from litert_torch.generative.examples.qwen_vl import qwen_vl as example

    hf = _config(folder)
    text, vision = hf["text_config"], hf["vision_config"]
    if not hf.get("tie_word_embeddings", text.get("tie_word_embeddings")):
        raise ValueError("the example's decoder ties lm_head to the embeddings; save a tied checkpoint")
    with open(os.path.join(folder, "image_size.json")) as f:
        config = example.get_model_config(image_size=tuple(json.load(f)))
    image = config.image_encoder_config
    image.image_embedding.patch_size = vision["patch_size"]
    image.image_embedding.temporal_patch_size = vision["temporal_patch_size"]
    image.num_layers = vision["depth"]
    image.embedding_dim = vision["hidden_size"]
    attn = image.block_config(0).attn_config
    attn.num_heads = attn.num_query_groups = vision["num_heads"]
    attn.head_dim = vision["hidden_size"] // vision["num_heads"]
    image.block_config(0).ff_config.intermediate_size = vision["intermediate_size"]
    image.merger_config.intermediate_size = vision["hidden_size"] * vision["spatial_merge_size"] ** 2
    image.merger_config.out_embedding_dim = vision["out_hidden_size"]
    image.window_size = vision["window_size"]
    image.spatial_merge_size = vision["spatial_merge_size"]
    image.full_atten_block_indexes = vision["fullatt_block_indexes"]

    decoder = config.decoder_config
    decoder.vocab_size = text["vocab_size"]
    decoder.num_layers = text["num_hidden_layers"]
    decoder.max_seq_len = text["max_position_embeddings"]
    decoder.embedding_dim = text["hidden_size"]
    attn = decoder.block_config(0).attn_config
    attn.num_heads = text["num_attention_heads"]
    attn.head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    attn.num_query_groups = text["num_key_value_heads"]
    rope = text.get("rope_parameters") or {}
    attn.rotary_base = rope.get("rope_theta", text.get("rope_theta", 1e6))
    decoder.block_config(0).ff_config.intermediate_size = text["intermediate_size"]
    decoder.final_norm_config.epsilon = text["rms_norm_eps"]  # the blocks' norms are the same object
    config.image_token_id = hf["image_token_id"]
    config.mrope_section = list(rope.get("mrope_section") or text["rope_scaling"]["mrope_section"])
    return config


def qwen_vl(folder: str, seq_len: int):
    """The example's Qwen 2.5 VL at the checkpoint's sizes (`qwen_vl_config`), loaded with
    its build_model and converted as its convert_to_tflite.py does (float): prefill_{seq_len}
    and prefill_{seq_len}_pixel (the image's merged patches added to seq_len), decode;
    cache QWEN_VL_CACHE. Returns the path."""
    import glob
    import tempfile

    from litert_torch.generative.examples.qwen_vl import qwen_vl as example
    from litert_torch.generative.utilities import converter, export_config

    config = qwen_vl_config(folder)
    example.get_model_config = lambda **kwargs: config  # build_model reads it; the rest is the example's
    model = example.build_model(folder, mask_cache_size=QWEN_VL_CACHE)
    grid_thw = model.image_encoder.get_grid_thw()
    merge = model.config.image_encoder_config.spatial_merge_size
    out = tempfile.mkdtemp()
    converter.convert_to_tflite(
        model,
        output_path=out,
        output_name_prefix="qwen_vl",
        prefill_seq_len=seq_len,
        kv_cache_max_len=QWEN_VL_CACHE,
        pixel_values_size=model.image_encoder.get_pixel_values_size(grid_thw),
        pixel_seq_len=(grid_thw[0][1] // merge) * (grid_thw[0][2] // merge),
        quantize="none",
        config=model.config.decoder_config,
        export_config=export_config.ExportConfig(),
    )
    (path,) = glob.glob(os.path.join(out, "*.tflite"))
    return path


# families converted by the example's own converter function: they return the .tflite path
CONVERTED = {"paligemma": paligemma, "qwen_vl": qwen_vl}
FAMILIES = {
    "t5": t5,
    "embedding_gemma": embedding_gemma,
    "sd_text_encoder": sd_text_encoder,
    "sd_vae_decoder": sd_vae_decoder,
    "sd_unet": sd_unet,
}


def _fail(stage: str, error: BaseException) -> None:
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    print(json.dumps({"error": last[:600], "stage": stage}), flush=True)
    raise SystemExit(1)


def main(family: str, folder: str, out_path: str, seq_len: int) -> None:
    _tensorflow_schema_shim()
    start = time.perf_counter()
    import torch

    import litert_torch

    import_s = time.perf_counter() - start
    torch.manual_seed(0)
    if family in CONVERTED:
        try:
            start = time.perf_counter()
            path = CONVERTED[family](folder, seq_len)  # building and loading the model included
            convert_s = time.perf_counter() - start
            shutil.copyfile(path, out_path)
        except Exception as e:
            _fail("convert", e)
        print(json.dumps({"import_s": import_s, "convert_s": convert_s, "path": out_path}), flush=True)
        return
    try:
        signatures = FAMILIES[family](folder, seq_len)
    except Exception as e:  # the finding is the example's own error
        _fail("load", e)
    try:
        start = time.perf_counter()
        builder = litert_torch
        for name, module, sample in signatures:
            builder = builder.signature(name, module, sample)
        with torch.no_grad():
            edge = builder.convert()
        convert_s = time.perf_counter() - start
        edge.export(out_path)
    except Exception as e:
        _fail("convert", e)
    print(json.dumps({"import_s": import_s, "convert_s": convert_s, "path": out_path}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
