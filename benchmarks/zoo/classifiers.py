"""Two small transformer classifiers for the quantization benchmark and tests (not zoo
entries: the zoo's transformers return hidden states, these return 10-class logits).

Built from `transformers` configs with seeded random weights; nothing is downloaded.
`transformers` is imported inside the factories so this module imports with torch only.
"""

from __future__ import annotations

import torch
from torch import nn

CLASSES = 10
VOCAB = 128
SEQ = 16


class Logits(nn.Module):
    """A transformers classifier called on one plain tensor, returning its logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x, return_dict=True).logits


def bert_classifier() -> nn.Module:
    """BertForSequenceClassification (2 layers, hidden 32, 2 heads, 10 labels) on (1, 16) token ids."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=CLASSES,
    )
    torch.manual_seed(0)
    return Logits(BertForSequenceClassification(config).eval())


def vit_classifier() -> nn.Module:
    """ViTForImageClassification (32x32 image, patch 8, 2 layers, hidden 32, 10 labels)."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=CLASSES,
    )
    torch.manual_seed(0)
    return Logits(ViTForImageClassification(config).eval())


def token_ids(generator: torch.Generator) -> tuple[torch.Tensor]:
    return (torch.randint(3, VOCAB, (1, SEQ), generator=generator, dtype=torch.int64),)


def image(generator: torch.Generator) -> tuple[torch.Tensor]:
    return (torch.randn((1, 3, 32, 32), generator=generator),)


# name -> (factory, make_inputs(generator))
CLASSIFIERS = {"bert_classifier": (bert_classifier, token_ids), "vit_classifier": (vit_classifier, image)}


def samples(name: str, count: int, seed: int) -> list[tuple[torch.Tensor]]:
    """`count` seeded inputs for classifier `name`; different seeds give disjoint sets
    as long as `count` stays under 7919."""
    make_inputs = CLASSIFIERS[name][1]
    return [make_inputs(torch.Generator().manual_seed(seed * 7919 + i)) for i in range(count)]
