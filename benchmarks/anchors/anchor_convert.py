"""Convert zoo models with the anchor converter (PyPI `litert-torch` 0.10.0) in ITS environment.

Run by `convert_bench.py --anchor-python ...`, never imported by it: the anchor's import
name `litert_torch` is the same as ours, so it lives in a separate virtual environment and
this script must not import anything from this repository except the torch-only zoo
(loaded by path).

    /tmp/anchor-venv/bin/python benchmarks/anchors/anchor_convert.py --out-dir DIR resnet18 mobilenet_v2

For each model it writes DIR/<name>.anchor.tflite and prints one JSON line to stdout:
{"model", "ok", "convert_s", "tflite": path} or {"model", "ok": false, "error"}.
Conversion time covers `litert_torch.convert(...)` and serialising to bytes, the same span
the benchmark times for our converter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from zoo_loader import REPO_ROOT, load_zoo


def import_anchor():
    """Import the anchor's `litert_torch`, refusing this repository's package of the same name."""
    import litert_torch

    location = Path(litert_torch.__file__).resolve()
    if REPO_ROOT in location.parents:
        sys.exit(
            f"anchor_convert.py imported this repository's litert_torch ({location}); run it with the "
            "anchor environment's python (see convert_bench.py's docstring for the setup command)"
        )
    return litert_torch


def convert_one(litert_torch, zoo, name: str, out_dir: Path, seed: int) -> dict:
    path = out_dir / f"{name}.anchor.tflite"
    try:
        # Inside the try: a transformers model needs `transformers` in the anchor's environment too.
        model, args = zoo.build(name, seed=seed)
        # The anchor logs its progress on stdout; keep stdout for our JSON lines.
        with contextlib.redirect_stdout(sys.stderr):
            start = time.perf_counter()
            content = litert_torch.convert(model, args).model_content()
            seconds = time.perf_counter() - start
    except Exception as error:  # report and go on with the next model
        return {"model": name, "ok": False, "error": f"{type(error).__name__}: {error}".splitlines()[0][:500]}
    path.write_bytes(content)
    return {"model": name, "ok": True, "convert_s": seconds, "tflite": str(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="zoo model names")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-model", default=None, help="convert this model first, untimed, to pay one-off costs")
    options = parser.parse_args()
    options.out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    start = time.perf_counter()
    litert_torch = import_anchor()
    zoo = load_zoo()
    print(json.dumps({"event": "ready", "import_s": time.perf_counter() - start}), flush=True)
    if options.warmup_model:
        warmup_dir = options.out_dir / "warmup"
        warmup_dir.mkdir(exist_ok=True)
        convert_one(litert_torch, zoo, options.warmup_model, warmup_dir, options.seed)
    for name in options.models:
        print(json.dumps(convert_one(litert_torch, zoo, name, options.out_dir, options.seed)), flush=True)


if __name__ == "__main__":
    main()
