"""Tiny random-weight image-to-text models from transformers configs, one builder per
family (shared by the tests and `benchmarks`): 16x16 images (Swin: 32x32), decoders of
two layers, a vocabulary of 96, weights drawn larger than the init's (std 0.3 for
matrices) so that greedy generation does not repeat one token."""

from __future__ import annotations

import warnings

import torch

VOCAB = 96
CACHE = 24
IMAGE = 16


def _quiet(build):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def _spread(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model.eval()


def _vit(t, kind="vit"):
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    if kind == "vit":
        return t.ViTConfig(image_size=IMAGE, patch_size=8, **common)
    if kind == "deit":
        return t.DeiTConfig(image_size=IMAGE, patch_size=8, **common)
    if kind == "beit":
        return t.BeitConfig(image_size=IMAGE, patch_size=8, use_relative_position_bias=True, **common)
    if kind == "swin":
        return t.SwinConfig(
            image_size=2 * IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4
        )
    raise KeyError(kind)


def _decoder(t, kind):
    if kind == "gpt2":
        return t.GPT2Config(
            n_embd=48, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2
        )
    if kind in ("trocr", "trocr sinusoidal"):  # trocr-base's layout: sinusoidal positions, scaled embeddings
        sinusoidal = dict(use_learned_position_embeddings=False, layernorm_embedding=False, scale_embedding=True)
        return t.TrOCRConfig(
            d_model=32,
            decoder_layers=2,
            decoder_attention_heads=2,
            decoder_ffn_dim=64,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            bos_token_id=0,
            pad_token_id=1,
            eos_token_id=2,
            **(sinusoidal if kind == "trocr sinusoidal" else {}),
        )
    small = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    if kind == "bert":
        return t.BertConfig(**small)
    if kind == "roberta":
        return t.RobertaConfig(**small, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    if kind == "mbart":
        return t.MBartConfig(
            d_model=32,
            decoder_layers=2,
            encoder_layers=2,
            decoder_attention_heads=2,
            encoder_attention_heads=2,
            decoder_ffn_dim=64,
            encoder_ffn_dim=64,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            is_decoder=True,
            add_cross_attention=True,
        )
    raise KeyError(kind)


PAIRS = {  # family -> (encoder, decoder)
    "vit + gpt2": ("vit", "gpt2"),
    "trocr (vit + trocr)": ("vit", "trocr"),
    "trocr, sinusoidal positions": ("vit", "trocr sinusoidal"),
    "donut (swin + mbart)": ("swin", "mbart"),
    "deit + bert": ("deit", "bert"),
    "beit + roberta": ("beit", "roberta"),
    "deit + roberta": ("deit", "roberta"),
}
FLORENCE = "florence-2 (davit + bart)"
FAMILIES = (*PAIRS, "blip", "git", FLORENCE)


def vision_encoder_decoder(encoder: str, decoder: str):
    import transformers as t

    torch.manual_seed(0)
    config = _quiet(
        lambda: t.VisionEncoderDecoderConfig.from_encoder_decoder_configs(
            _vit(t, encoder), _decoder(t, decoder), decoder_start_token_id=0, pad_token_id=1
        )
    )
    return _spread(_quiet(lambda: t.VisionEncoderDecoderModel(config)))


def blip():
    import transformers as t

    torch.manual_seed(0)
    config = t.BlipConfig(
        vision_config=dict(
            image_size=IMAGE,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        ),
        text_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            encoder_hidden_size=32,
            bos_token_id=3,
            pad_token_id=0,
            sep_token_id=2,
            eos_token_id=2,
        ),
        projection_dim=32,
    )
    return _spread(_quiet(lambda: t.BlipForConditionalGeneration(config)))


def build(family: str):
    if family in ("blip", "git", FLORENCE):
        return {"blip": blip, "git": git, FLORENCE: florence2}[family]()
    return vision_encoder_decoder(*PAIRS[family])


def export_options(family: str) -> dict:
    """What export_image_to_text needs besides the model (Florence-2: its DaViT has no
    configured image size, and the task prompt is padded to a fixed length)."""
    return dict(image_size=FLORENCE_IMAGE, prompt_len=8) if family == FLORENCE else {}


def task_prompt(model) -> list[int] | None:
    """Florence-2's encoder prompt (bos, a task prompt, eos); None for the others."""
    return [0, 5, 6, 7, 2] if type(model).__name__ == "Florence2ForConditionalGeneration" else None


def image_for(model, seed: int = 0) -> torch.Tensor:
    from litert_torch.generative.image_to_text import CachedImageToText

    florence = type(model).__name__ == "Florence2ForConditionalGeneration"
    shape = CachedImageToText.image_shape(model, FLORENCE_IMAGE if florence else None)
    return torch.randn(shape[1:], generator=torch.Generator().manual_seed(seed))


def git():
    import transformers as t

    torch.manual_seed(0)
    config = t.GitConfig(
        vision_config=dict(
            image_size=IMAGE,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        ),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        bos_token_id=3,
        eos_token_id=2,
        pad_token_id=0,
    )
    return _spread(_quiet(lambda: t.GitForCausalLM(config)))


FLORENCE_IMAGE = 32  # DaViT: stride 4, then 2: 4 x 4 image tokens at 32 x 32 (and a pooled one)


def florence2():
    import transformers as t

    torch.manual_seed(0)
    config = t.Florence2Config(
        vision_config=dict(
            depths=[1, 1],
            patch_size=[7, 3],
            patch_stride=[4, 2],
            patch_padding=[3, 1],
            patch_prenorm=[False, True],
            embed_dim=[16, 32],
            num_heads=[2, 2],
            num_groups=[2, 2],
            window_size=2,
            projection_dim=32,
            max_position_embeddings=8,
            drop_path_rate=0.0,
        ),
        text_config=dict(
            model_type="bart",
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
            forced_eos_token_id=None,
            forced_bos_token_id=None,
        ),
        image_token_id=VOCAB - 1,
    )
    return _spread(_quiet(lambda: t.Florence2ForConditionalGeneration(config)))


@torch.no_grad()
def transformers_generate(model, image: torch.Tensor, steps: int):
    """transformers' own greedy `generate` (its cache, no stop token): new tokens and the
    logits of each step."""
    from litert_torch.generative.image_to_text import florence_input_ids, image_to_text_prompt

    if type(model).__name__ == "BlipForConditionalGeneration":
        sep, model.config.text_config.sep_token_id = model.config.text_config.sep_token_id, None  # no stop token
        try:
            out = model.generate(
                image[None], max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True
            )
        finally:
            model.config.text_config.sep_token_id = sep
    elif type(model).__name__ in ("GitForCausalLM", "Florence2ForConditionalGeneration"):
        if task_prompt(model) is None:  # GIT starts from a prompt of its bos token
            prompt = torch.tensor([image_to_text_prompt(model)])
        else:  # Florence-2's encoder reads image tokens and the task prompt
            prompt = florence_input_ids(model, image[None], task_prompt(model))
        out = model.generate(
            pixel_values=image[None],
            input_ids=prompt,
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=None,
            forced_eos_token_id=None,  # mBART's: an eos forced at max_length
            output_logits=True,
            return_dict_in_generate=True,
        )
    else:
        out = model.generate(
            image[None],
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=None,
            forced_eos_token_id=None,  # mBART's: an eos forced at max_length
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, -steps:].tolist(), [row[0].numpy() for row in out.logits]
