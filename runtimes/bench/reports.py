"""Bench results out: JSON files (written atomically) and bar charts."""

from __future__ import annotations

import json
import os


def write_json(result: dict, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, path)


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
    tmp = f"{path}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path
