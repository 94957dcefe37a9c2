"""The image-to-text rows of docs/generative_families.md: each family exported with
`export_image_to_text` (the tiny random-weight configs of
benchmarks/families/image_to_text.py), generated greedily in LiteRT
and compared with transformers' own `generate`.

Per family: status (exact: every greedy token equal to `generate`'s and every step's
logits within 1e-4 max relative; or refused, with the reason), the largest logit error
over the steps, the .tflite size, the time of one `encode_image` call and the median
time of one `decode` call (the interpreter's default settings, wall clock).

    python -m benchmarks.generative.image_to_text_bench            # print the table
    python -m benchmarks.generative.image_to_text_bench blip git   # some families
"""

from __future__ import annotations

import statistics
import sys
import time

from benchmarks.families.image_to_text import (
    CACHE,
    FAMILIES,
    build,
    export_options,
    image_for,
    task_prompt,
    transformers_generate,
)
from litert_torch.generative import UnsupportedModelError
from litert_torch.generative.image_to_text import (
    ImageToTextSession,
    export_image_to_text,
    image_to_text_prompt,
)
from runtimes.litert import max_relative_error

TOLERANCE = 1e-4
STEPS = 16


def family_row(family: str) -> list[str]:
    model = build(family)
    try:
        edge = export_image_to_text(model, cache_len=CACHE, progress=False, **export_options(family))
    except UnsupportedModelError as e:
        return [family, "image-to-text", f"refused: {str(e).split(': ', 1)[-1]}", "-", "-", "-"]
    image = image_for(model)
    want, want_rows = transformers_generate(model, image, STEPS)
    start = time.perf_counter()
    session = ImageToTextSession(edge, image, task_prompt(model))
    encode_ms = (time.perf_counter() - start) * 1e3
    prompt = image_to_text_prompt(model)
    for token in prompt[:-1]:
        session.step(token)
    got, errors, times, token = [], [], [], prompt[-1]
    for want_row in want_rows:
        start = time.perf_counter()
        row = session.step(token)
        times.append(time.perf_counter() - start)
        errors.append(max_relative_error(row, want_row))
        token = int(row.argmax())
        got.append(token)
    exact = got == want and max(errors) <= TOLERANCE
    same = sum(a == b for a, b in zip(got, want))
    status = f"exact, {STEPS} steps" if exact else f"differs ({same}/{STEPS} tokens)"
    return [
        family,
        f"first encode_image ({encode_ms:.0f} ms, with setup) + decode",
        status,
        f"{max(errors):.0e}",
        f"{len(edge) / 1e6:.2f} MB",
        f"{statistics.median(times) * 1e3:.2f} ms/token",
    ]


def main(argv=None) -> list[list[str]]:
    families = (argv if argv is not None else sys.argv[1:]) or FAMILIES
    rows = [family_row(f) for f in families]
    print("| family | task | status | max logit err | size | latency |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return rows


if __name__ == "__main__":
    main()
