"""Embedders: sentence embedders (a transformers text body, pooled as sentence-transformers
pools it outside the model: `pooling=`, normalised; one `embed` signature with a dynamic
batch and length, `export_embedder`), image embedders (CLIP's and SigLIP's vision towers:
CLIP-with-projection's `image_embeds`, otherwise the tower's `pooler_output`, one image per
call) and dual encoders (CLIPModel, SiglipModel: `embed_image` and `embed_text` signatures,
what `get_image_features` / `get_text_features` return, one row per call)."""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch import nn

from litert_torch.generative.embedder import export_embedder
from litert_torch.generative.errors import UnsupportedModelError
from litert_torch.generative.families.family import Family, as_array

TOLERANCE = 1e-4


def _forward_takes(model: nn.Module) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def _is_text_embedder(model: nn.Module) -> bool:
    takes = _forward_takes(model)
    return (
        not callable(getattr(model, "generate", None))
        and {"input_ids", "attention_mask"} <= takes
        and "pixel_values" not in takes
        and not getattr(model.config, "is_encoder_decoder", False)
    )


def _is_dual_encoder(model: nn.Module) -> bool:
    return callable(getattr(model, "get_image_features", None)) and callable(getattr(model, "get_text_features", None))


def _is_image_embedder(model: nn.Module) -> bool:
    takes = _forward_takes(model)
    return "pixel_values" in takes and "input_ids" not in takes and not callable(getattr(model, "generate", None))


def _convert_text(model, sample, sizes, options):
    max_len = sizes["max_len"]
    if max_len is None and "input_ids" in sample:
        max_len = max(2, as_array(sample["input_ids"], "input_ids", 2).shape[1])
    return export_embedder(
        model, pooling=sizes["pooling"], normalize=sizes["normalize"], max_len=max_len, head=sizes["head"], **options
    )


def _embed_text(edge, inputs, facts):
    types = inputs.get("token_type_ids")
    if types is not None and as_array(types, "token_type_ids").any():
        raise ValueError(
            "token_type_ids has ones (a second segment, e.g. a sentence pair): the file embeds one segment, "
            "token types all 0"
        )
    ids = as_array(inputs["input_ids"], "input_ids", 2).astype(np.int32)
    mask = inputs.get("attention_mask")
    mask = np.ones_like(ids) if mask is None else as_array(mask, "attention_mask", 2).astype(np.int32)
    return edge(ids, mask, signature_name="embed")


class ImageEmbeds(nn.Module):
    """The vision tower's embedding: `image_embeds` where the model projects it (CLIP with
    projection), else `pooler_output` (SigLIP's attention-pooled head, CLIP's class token)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        embeds = getattr(out, "image_embeds", None)
        if embeds is None:
            embeds = getattr(out, "pooler_output", None)
        if embeds is None:
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: its output has neither image_embeds nor pooler_output"
            )
        return embeds


def _convert_image(model, sample, sizes, options):
    from converter.pipeline import cpu_view
    from litert_torch.api import convert

    if "pixel_values" not in sample:
        raise ValueError(f"{type(model).__name__}: pass a sample with pixel_values (the image processor's output)")
    image = torch.as_tensor(as_array(sample["pixel_values"], "pixel_values", 4)[:1]).float()
    verify = options.pop("verify")
    wrapper = ImageEmbeds(cpu_view(model)).eval()
    edge = convert(wrapper, (image,), **options)
    if verify and options.get("quant_config") is None:
        _check_against_pytorch(edge, model, {None: (wrapper, (image,))})
    return edge


def _check_against_pytorch(edge, model: nn.Module, towers: dict) -> None:
    """Refuse a file whose embeddings (one per signature name: module, sample) differ from
    PyTorch's by more than TOLERANCE."""
    from runtimes.litert import max_relative_error

    for name, (module, args) in towers.items():
        with torch.no_grad():
            expected = module(*args).numpy()
        error = max_relative_error(edge(*args, signature_name=name), expected)
        if not error <= TOLERANCE:
            raise UnsupportedModelError(
                f"{type(model).__name__}: the LiteRT file's {name or 'embedding'} differs from PyTorch's by "
                f"{error:.3g} (max relative); refusing to return a different model"
            )


class _Features(nn.Module):
    """`model.get_image_features` or `get_text_features` as a tensor: the projected pooled
    embedding transformers returns (its `pooler_output`, in transformers 5's output class)."""

    def __init__(self, model: nn.Module, image: bool):
        super().__init__()
        self.model, self.image = model, image

    def forward(self, *inputs):
        if self.image:
            out = self.model.get_image_features(pixel_values=inputs[0])
        else:
            out = self.model.get_text_features(*inputs)
        return out if isinstance(out, torch.Tensor) else out.pooler_output


def _convert_dual(model, sample, sizes, options):
    from converter.pipeline import cpu_view
    from litert_torch.signatures import signature

    if "pixel_values" not in sample or "input_ids" not in sample:
        raise ValueError(
            f"{type(model).__name__}: pass a sample with pixel_values and input_ids (the processor's outputs for an "
            "image and a text, the text padded as the processor pads it: padding='max_length')"
        )
    model = cpu_view(model).eval()
    image = torch.as_tensor(as_array(sample["pixel_values"], "pixel_values", 4)[:1]).float()
    text = [torch.as_tensor(as_array(sample["input_ids"], "input_ids", 2)[:1]).long()]
    if "attention_mask" in sample:
        text.append(torch.as_tensor(as_array(sample["attention_mask"], "attention_mask", 2)[:1]).long())
    towers = {"embed_image": (_Features(model, True), (image,)), "embed_text": (_Features(model, False), tuple(text))}
    verify = options.pop("verify")
    builder = None
    for name, (module, args) in towers.items():
        builder = (signature if builder is None else builder.signature)(name, module, args, output_names=["embeddings"])
    edge = builder.convert(**options)
    if verify and options.get("quant_config") is None:
        _check_against_pytorch(edge, model, towers)
    return edge


def _embed_dual(edge, inputs, facts):
    if ("pixel_values" in inputs) == ("input_ids" in inputs):
        raise ValueError("pass pixel_values (image embeddings) or input_ids (text embeddings), one at a time")
    if "pixel_values" in inputs:
        return _embed_image(edge, inputs, facts, "embed_image")
    text = edge.runtime.signature("embed_text")
    ids = as_array(inputs["input_ids"], "input_ids", 2).astype(np.int64)
    mask = inputs.get("attention_mask")
    mask = np.ones_like(ids) if mask is None else as_array(mask, "attention_mask", 2).astype(np.int64)
    width = text.inputs[0].shape[1]
    if ids.shape[1] != width:
        raise ValueError(
            f"input_ids has {ids.shape[1]} tokens a row; the file takes {width}: pad as the processor pads "
            f"(padding='max_length', max_length={width})"
        )
    rows = [(row[None],) + ((keep[None],) if len(text.inputs) > 1 else ()) for row, keep in zip(ids, mask)]
    return np.concatenate([edge(*row, signature_name="embed_text") for row in rows])


def _embed_image(edge, inputs, facts, signature_name=None):
    if "pixel_values" not in inputs:
        raise ValueError("pass pixel_values (the image processor's output)")
    pixels = as_array(inputs["pixel_values"], "pixel_values", 4).astype(np.float32)
    runner = edge.runtime.signature(signature_name) if signature_name else edge.runtime.signatures[0]
    expected = tuple(runner.inputs[0].shape[1:])
    if pixels.shape[1:] != expected:
        raise ValueError(f"pixel_values has images of shape {pixels.shape[1:]}; the file takes {expected}")
    return np.concatenate([edge(image[None], signature_name=runner.key) for image in pixels])


FAMILIES = [
    Family(
        name="dual encoder",
        matches=_is_dual_encoder,
        inputs=("pixel_values", "input_ids", "attention_mask"),
        convert=_convert_dual,
        embed=_embed_dual,
    ),
    Family(
        name="sentence embedder",
        matches=_is_text_embedder,
        inputs=("input_ids", "attention_mask", "token_type_ids"),  # BERT tokenizers give token types
        convert=_convert_text,
        sizes={"pooling": "mean", "normalize": True, "max_len": None, "head": None},
        embed=_embed_text,
    ),
    Family(
        name="image embedder",
        matches=_is_image_embedder,
        inputs=("pixel_values",),
        convert=_convert_image,
        embed=_embed_image,
    ),
]
