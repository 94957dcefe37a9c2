"""Every generative family through the one call, beside transformers: the rows of
docs/generative_families.md's "One call" table.

Per family (the tiny configs of benchmarks/families/, a batch of two rows shaped as the
processor gives them; `benchmarks.families.one_call.every_case`):
`litert_torch.generative.convert(model, inputs)`, then `generate(**inputs, max_new_tokens=10)`
in LiteRT against `model.generate(**inputs, max_new_tokens=10)` (the model's generation
config, its end tokens on): "same ids" or "DIFFERENT"; then with every row kept running
(min_new_tokens) the largest relative error of any step's logits against transformers'
`output_logits`; the conversion time. A family refused by name says why, and a family whose
own transformers `generate` fails on the tiny config says so.

    python -m benchmarks.generative.one_call_bench              # every family
    python -m benchmarks.generative.one_call_bench llama t5     # names containing these
"""

from __future__ import annotations

import sys
import time
import warnings

import torch

from benchmarks.families.one_call import every_case
from litert_torch.generative import UnsupportedModelError, convert
from runtimes.litert import max_relative_error

NEW = 10
HEADER = "| family | one call | max logit err | convert |\n| --- | --- | --- | --- |"


def measure(name: str, case) -> str:
    """One markdown row."""
    build, inputs_for, sizes = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build()
        inputs = inputs_for(model)
        with torch.no_grad():
            try:
                want = model.generate(**inputs, max_new_tokens=NEW)
            except Exception as e:  # noqa: BLE001  (the tiny config's own generate: reported, not ours)
                return f"| {name} | transformers' generate fails on this config: {type(e).__name__} | | |"
        start = time.perf_counter()
        try:
            edge = convert(model, inputs, progress=False, **sizes)
        except (UnsupportedModelError, NotImplementedError) as e:
            return f"| {name} | refused: {str(e).split(':', 1)[-1].strip()} | | |"
        seconds = time.perf_counter() - start
        got = edge.generate(**inputs, max_new_tokens=NEW)
        status = "same ids" if got.tolist() == want.tolist() else "DIFFERENT"
        options = dict(max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True, return_dict_in_generate=True)
        with torch.no_grad():
            reference = model.generate(**inputs, **options).logits
        logits = edge.generate(**inputs, **options).logits
    error = max(max_relative_error(g.numpy(), w.numpy()) for g, w in zip(logits, reference))
    rows = f"{len(got)} row{'s' * (len(got) > 1)}"
    return f"| {name} | {status} ({rows}) | {error:.1e} | {seconds:.1f} s |"


def main(argv: list[str]) -> list[str]:
    cases = every_case()
    names = [n for n in cases if not argv or any(a in n for a in argv)]
    if not names:
        raise SystemExit(f"no family name contains {' or '.join(argv)}; names: {', '.join(cases)}")
    print(HEADER, flush=True)
    rows = []
    for name in names:
        rows.append(measure(name, cases[name]))
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
