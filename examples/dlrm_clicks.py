"""Train a DLRM-style click model on "tpu", ship it to LiteRT.

    .venv/bin/python examples/dlrm_clicks.py              # 400 steps
    .venv/bin/python examples/dlrm_clicks.py --steps 80   # the quick form

Data is generated: each impression has 8 dense features and 3 categorical ones (ids
into tables of 100, 500 and 1,000 rows). A hidden rule (a linear score of the dense
features plus a per-id effect) decides the click probability, so there is signal to
learn. The model is DLRM's shape: embedding tables, a bottom MLP for the dense
features, pairwise dot-product interactions, a top MLP to one logit. Printed: ROC AUC
on 2,000 fresh impressions for PyTorch and LiteRT (and the hidden rule's own AUC, the
ceiling), the largest difference between the two models, latency and size.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flow import cli, console, mean_loss, median_us, results_table, run_per_sample, torch_cpu_latency_us, train  # noqa: E402

import litert_torch  # noqa: E402
from runtimes.litert import max_relative_error  # noqa: E402

DENSE, TABLES, DIM = 8, (100, 500, 1000), 16


class ClickRule:
    """The hidden generator of clicks: p(click) = sigmoid(w . dense + sum of id effects - 1)."""

    def __init__(self, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.weights = torch.randn(DENSE, generator=gen)
        self.effects = [1.5 * torch.randn(rows, generator=gen) for rows in TABLES]

    def sample(self, n: int, gen: torch.Generator):
        dense = torch.randn(n, DENSE, generator=gen)
        ids = torch.stack([torch.randint(0, rows, (n,), generator=gen) for rows in TABLES], dim=1)
        score = dense @ self.weights + sum(effect[ids[:, i]] for i, effect in enumerate(self.effects)) - 1.0
        clicks = torch.bernoulli(torch.sigmoid(score), generator=gen)
        return dense, ids, clicks, score


def mlp(*sizes: int) -> nn.Sequential:
    layers = []
    for cin, cout in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(cin, cout), nn.ReLU()]
    return nn.Sequential(*layers[:-1])  # no activation after the last layer


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(rows, DIM) for rows in TABLES)
        self.bottom = mlp(DENSE, 32, DIM)
        features = 1 + len(TABLES)
        self.register_buffer("pairs", torch.triu_indices(features, features, offset=1), persistent=False)
        self.top = mlp(DIM + features * (features - 1) // 2, 32, 1)

    def forward(self, dense, ids):
        x = self.bottom(dense)
        vectors = torch.stack([x] + [table(ids[:, i]) for i, table in enumerate(self.tables)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))  # (batch, features, features)
        interactions = dots[:, self.pairs[0], self.pairs[1]]  # each pair once
        return self.top(torch.cat([x, interactions], dim=1)).squeeze(1)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores))


def run(steps: int = 400, batch_size: int = 256, lr: float = 1e-2, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    rule, gen = ClickRule(seed), torch.Generator().manual_seed(seed + 1)
    batches = ((dense, ids, clicks) for dense, ids, clicks, _ in (rule.sample(batch_size, gen) for _ in range(steps)))
    model = DLRM().to("tpu")
    losses = train(model, batches, nn.functional.binary_cross_entropy_with_logits, lr=lr)

    dense, ids, clicks, score = rule.sample(2000, torch.Generator().manual_seed(seed + 2))
    with torch.no_grad():
        torch_logits = model(dense.to("tpu"), ids.to("tpu")).cpu().numpy()
    sample = (dense[:1], ids[:1])
    edge = litert_torch.convert(model, sample)
    with tempfile.TemporaryDirectory() as folder:
        path = edge.export(os.path.join(folder, "dlrm.tflite"))
        size = os.path.getsize(path)
        edge = litert_torch.load(path)
        litert_logits = run_per_sample(edge, dense, ids)
        litert_us = median_us(lambda: edge(*sample))
    labels = clicks.numpy()
    return {
        "loss_start_end": mean_loss(losses, 20),
        "steps": steps,
        "bytes": size,
        "max_relative_error": max_relative_error(litert_logits, torch_logits),
        "rule_auc": roc_auc(labels, score.numpy()),
        "pytorch": {"auc": roc_auc(labels, torch_logits), "latency_us": torch_cpu_latency_us(model, sample)},
        "litert": {"auc": roc_auc(labels, litert_logits), "latency_us": litert_us},
    }


def report(results: dict) -> None:
    start, end = results["loss_start_end"]
    rows = [
        ["hidden rule (the ceiling)", f"{results['rule_auc']:.3f}", "-", "-", "-"],
        [
            "PyTorch (CPU, 1 thread)",
            f"{results['pytorch']['auc']:.3f}",
            "reference",
            f"{results['pytorch']['latency_us']:.0f} us",
            "-",
        ],
        [
            "LiteRT float32",
            f"{results['litert']['auc']:.3f}",
            f"{results['max_relative_error']:.1e}",
            f"{results['litert']['latency_us']:.0f} us",
            f"{results['bytes']:,} B",
        ],
    ]
    console.print(
        results_table(
            f"DLRM trained on tpu ({results['steps']} steps, loss {start:.3f} -> {end:.3f}), 2,000 fresh impressions",
            ["model", "ROC AUC", "max rel. error", "latency", "size"],
            rows,
        )
    )


def main(argv=None) -> dict:
    return cli(__doc__, run, report, argv, steps=400, batch_size=256, lr=1e-2)


if __name__ == "__main__":
    main()
