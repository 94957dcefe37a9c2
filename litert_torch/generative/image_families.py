"""Image-to-text families (transformers class names): the ones `export_image_to_text`
takes and the ones refused by name. The other generative exports (`export_generative`,
`export_seq2seq`, `export_vlm`) send these models there with `redirect_image_to_text`;
kept below all of them and `image_to_text.py`, which build on each other."""

from __future__ import annotations

from torch import nn

from litert_torch.generative.errors import UnsupportedModelError

# Image-to-text families (transformers class names) that export_image_to_text takes.
FAMILIES = (
    "VisionEncoderDecoderModel",
    "BlipForConditionalGeneration",
    "GitForCausalLM",
    "Florence2ForConditionalGeneration",
)


# Image-to-text families refused by name, with the reason and what would be needed.
REFUSED = {
    "Blip2ForConditionalGeneration": (
        "BLIP-2 reads its Q-Former's query embeddings as prompt tokens of a decoder-only LM (OPT) or a T5 encoder, "
        "not by cross-attention from the decoder: the export_vlm shape, which would need BLIP-2 in its families "
        "(the Q-Former in encode_image)"
    ),
    "InstructBlipForConditionalGeneration": (
        "InstructBLIP's Q-Former reads the text prompt too, and its query embeddings are prompt tokens of an LM: "
        "encode_image would need the prompt as an input and the LM an export_vlm prefill"
    ),
    "Pix2StructForConditionalGeneration": (
        "Pix2Struct takes a variable number of flattened patches (aspect-ratio preserving), not a fixed image size"
    ),
}


def redirect_image_to_text(model: nn.Module, api: str) -> None:
    """Raise, in `api`, the refusal that sends an image-to-text model to export_image_to_text."""
    name = type(model).__name__
    if name in FAMILIES:
        raise UnsupportedModelError(
            f"{name}: an image encoder with a text decoder reading it (image-to-text): {api} does not take it; "
            "export it with export_image_to_text (encode_image + decode with self and cross caches)"
        )
    if name in REFUSED:
        raise UnsupportedModelError(f"{name}: {REFUSED[name]}")
