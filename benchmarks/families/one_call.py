"""Every generative family as `litert_torch.generative.convert` takes it: a tiny model from
its transformers config and a batch of two rows shaped as its tokenizer or processor gives
them (decoders padded on the left, sources on the right, images in the processor's layout),
with the sizes to convert it with. Shared by tests/litert_torch/generative/test_one_call.py
(`CASES`: one model per family kind, in the default suite) and
`benchmarks.generative.one_call_bench` (`every_case()`: every family of the zoos)."""

from __future__ import annotations

import torch

from benchmarks.families import causal_lm as lm
from benchmarks.families import image_to_text as itt
from benchmarks.families import qwen_vl as tq
from benchmarks.families import seq2seq as s2s
from benchmarks.families import vlm as tv
from litert_torch.generative import qwen_vl
from litert_torch.generative.image_to_text import florence_input_ids


def left_padded(rows: list[list[int]], pad: int = 0) -> dict:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return {"input_ids": ids, "attention_mask": mask}


def right_padded(rows: list[list[int]], pad: int = 0) -> dict:
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask}


def words(n: int, seed: int) -> list[int]:
    return torch.randint(3, 89, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def qwen_inputs(model, prompts_and_images) -> dict:
    inputs = left_padded([p for p, _ in prompts_and_images])
    patches, grids = qwen_vl.model_patches(model, [image for _, images in prompts_and_images for image in images])
    ids = inputs["input_ids"]
    return dict(
        inputs, pixel_values=patches, image_grid_thw=torch.tensor(grids), mm_token_type_ids=(ids == tq.IMAGE).int()
    )


def vlm_inputs(model, rows: list[list[int]], images: int) -> dict:
    inputs = left_padded(rows)
    pixels = tv.pixels(images, size=model.config.vision_config.image_size)
    image_token = model.config.image_token_id
    if type(model).__name__.startswith("PaliGemma"):
        types = torch.zeros_like(inputs["input_ids"])
    else:
        types = (inputs["input_ids"] == image_token).long()
    return dict(inputs, pixel_values=pixels, token_type_ids=types)


def paligemma_prompt(model, seed: int) -> list[int]:
    return [model.config.image_token_id] * model.config.text_config.num_image_tokens + [2] + words(3, seed)


def image_to_text_inputs(model) -> dict:
    pixels = torch.stack([itt.image_for(model, seed=s) for s in (0, 1)])
    if type(model).__name__.startswith("Florence2"):  # its encoder reads image tokens, then the task prompt
        prompt = itt.task_prompt(model)
        ids = torch.cat([florence_input_ids(model, pixels[:1], prompt), florence_input_ids(model, pixels[:1], prompt)])
        return {"pixel_values": pixels, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return {"pixel_values": pixels}


# name -> (build the model, its processor-shaped inputs (a batch of two rows where the family
# takes one), convert's sizes): one model per kind of family
CASES = {
    "llama": (lambda: lm.build("llama"), lambda m: left_padded([words(6, 1), words(3, 2)]), {"cache_len": 48}),
    "gpt2 (learned positions, tied head)": (
        lambda: lm.build("gpt2"),
        lambda m: left_padded([words(5, 1), words(7, 2)]),
        {"cache_len": 48},
    ),
    "gemma3 text (sliding window)": (
        lambda: lm.build("gemma3 text"),
        lambda m: left_padded([words(9, 1), words(4, 2)]),
        {"cache_len": 48, "prefill_len": 4},
    ),
    "t5": (lambda: s2s.build("t5"), lambda m: right_padded([words(12, 1), words(7, 2)]), {"cache_len": 24}),
    "bart": (lambda: s2s.build("bart"), lambda m: right_padded([words(9, 1), words(12, 2)], pad=1), {"cache_len": 24}),
    "whisper": (
        lambda: s2s.build("whisper"),
        lambda m: {"input_features": torch.stack([s2s.source_for(m, seed=s) for s in (1, 2)])},
        {"cache_len": 24},
    ),
    "speech_to_text (masked frames)": (
        lambda: s2s.build("speech_to_text"),
        lambda m: {
            "input_features": torch.stack([s2s.source_for(m, seed=s, length=20) for s in (1, 2)]),
            # row 1's frames past its mask are not zeros: its convolutions read them, as transformers' do
            "attention_mask": torch.tensor([[1] * 20, [1] * 13 + [0] * 7]),
        },
        {"cache_len": 24},
    ),
    "vit + gpt2": (lambda: itt.build("vit + gpt2"), image_to_text_inputs, {"cache_len": 24}),
    "blip": (lambda: itt.build("blip"), image_to_text_inputs, {"cache_len": 24}),
    "git": (lambda: itt.build("git"), image_to_text_inputs, {"cache_len": 24}),
    "florence-2": (lambda: itt.build(itt.FLORENCE), image_to_text_inputs, {"cache_len": 24}),
    "gemma3 (two rows, an image each)": (
        tv.gemma3_vlm,
        lambda m: vlm_inputs(m, [tv.prompt_with_images(1, 3, 2, seed=1), tv.prompt_with_images(1, 1, 2, seed=2)], 2),
        {"cache_len": 48, "prefill_len": 8},
    ),
    "paligemma (prefix-LM)": (
        tv.paligemma,
        lambda m: vlm_inputs(m, [paligemma_prompt(m, 1), paligemma_prompt(m, 2)[:-1]], 2),
        {"cache_len": 48},
    ),
    "smolvlm (two rows of 2x2 tiles)": (
        tv.smolvlm,
        lambda m: dict(
            left_padded([tv.prompt_with_images(5, 2, 2, seed=1), tv.prompt_with_images(5, 1, 2, seed=2)]),
            pixel_values=tv.pixels(10, size=m.config.vision_config.image_size).reshape(2, 5, 3, 32, 32),
        ),
        {"cache_len": 48, "prefill_len": 8},
    ),
    "qwen2-vl (rows with images of two grids)": (
        tq.qwen2_vl,
        lambda m: qwen_inputs(
            m,
            [
                (tq.prompt_for([tq.GRIDS[0]], seed=1), [tq.image(tq.GRIDS[0], seed=3)]),
                (tq.prompt_for(tq.GRIDS[::-1], seed=2), [tq.image(tq.GRIDS[1], seed=4), tq.image(tq.GRIDS[0])]),
            ],
        ),
        {"cache_len": 48, "prefill_len": 8},
    ),
}


def every_case() -> dict:
    """`CASES` and every other family of the zoos (causal LMs, encoder-decoders, image-to-text,
    SmolVLM's parent, Qwen2.5-VL), including the ones refused by name."""
    cases = {f"causal LM: {name}": _causal_lm(name) for name in lm.FAMILIES}
    for name in s2s.FAMILIES:
        if name in ("whisper", "speech_to_text"):
            continue
        cases[f"encoder-decoder: {name}"] = _seq2seq(name)
    for name in itt.FAMILIES:
        cases[f"image-to-text: {name}"] = (lambda name=name: itt.build(name), image_to_text_inputs, {"cache_len": 24})
    for name in ("whisper", "speech_to_text (masked frames)"):
        cases[f"speech: {name}"] = CASES[name]
    for name in CASES:
        if name.startswith(("gemma3 (", "paligemma", "smolvlm", "qwen2-vl")):
            cases[f"vision-language: {name}"] = CASES[name]
    cases["vision-language: idefics3 (two rows of 2x2 tiles)"] = (
        lambda: tv.smolvlm("Idefics3"),
        *CASES["smolvlm (two rows of 2x2 tiles)"][1:],
    )
    qwen = CASES["qwen2-vl (rows with images of two grids)"]
    cases["vision-language: qwen2.5-vl (rows with images of two grids)"] = (tq.qwen2_5_vl, *qwen[1:])
    return cases


def _causal_lm(name: str):
    return (
        lambda: lm.build(name),
        lambda m: left_padded([words(6, 1), words(3, 2)]),
        {"cache_len": 48, "prefill_len": 8},
    )


def _seq2seq(name: str):
    def inputs(model):
        if name.startswith("moonshine"):
            return {"input_values": torch.stack([s2s.source_for(model, seed=s) for s in (1, 2)])}
        return right_padded([words(12, 1), words(7, 2)], pad=model.config.pad_token_id or 0)

    return (lambda: s2s.build(name), inputs, {"cache_len": 24})
