"""Bench results out: JSON files (written atomically) and bar charts."""

from __future__ import annotations

import io
import json
import os

from common.files import write_atomic


def write_json(result: dict, path: str) -> None:
    write_atomic(path, [json.dumps(result, indent=2).encode()])


def plot(results: list[dict], path: str, title: str = "Inference time") -> str:
    """A PNG bar chart of p50 inference time (with min..p90 whiskers) per result; labels
    are 'model (target)'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, p50, low, high = [], [], [], []
    for r in results:
        s = r["inference_us"]
        labels.append(f"{os.path.basename(str(r['model']))}\n({r['target']})")
        p50.append(s["p50"] / 1e3)
        low.append((s["p50"] - s["min"]) / 1e3)
        high.append(((s.get("p90") or s.get("p95") or s["max"]) - s["p50"]) / 1e3)
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(results)), 3.6))
    ax.bar(range(len(results)), p50, yerr=[low, high], capsize=4, color="#4c72b0")
    ax.set_xticks(range(len(results)), labels, fontsize=8)
    ax.set_ylabel("ms (p50; whiskers min..p90)")
    ax.set_title(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    return write_atomic(path, [png.getvalue()])
