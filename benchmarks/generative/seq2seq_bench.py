"""The encoder-decoder rows of docs/generative_families.md: each family exported with
`export_seq2seq`, generated greedily in LiteRT and compared with transformers.

Per family (random weights, configs in code): status (exact: every greedy token equal and
every step's logits within 1e-4 max relative of transformers' forward; or refused, with
the reason), the largest logit error over the steps, the .tflite size, and the LiteRT
latency of one `decode` call (median over the generated tokens, 1 thread, XNNPACK, the
self and cross caches passed in as `generate_seq2seq` does). With `--real`, the
Whisper-tiny and T5-small shapes also as dynamic int8 and int4 (blocks of 32) files:
their logits along transformers' float tokens (teacher forcing) and how many of their
own greedy tokens equal the float model's.

    python -m benchmarks.generative.seq2seq_bench                # the tiny test configs
    python -m benchmarks.generative.seq2seq_bench --real         # + Whisper-tiny and T5-small shapes
    python -m benchmarks.generative.seq2seq_bench --real --write # update docs/generative_families.md
    python -m benchmarks.generative.seq2seq_bench --attention-ab # sdpa vs matmul attention, real shapes

`--write` replaces the rows of the families it ran (matched by the first column) and
appends new ones, keeping every other row of the table (other tasks add their own).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time

import numpy as np

from benchmarks.harness import ROOT, median_ms

sys.path.insert(0, str(ROOT / "examples"))  # seq2seq_generate's real-model builders
from litert_torch.generative import (
    Seq2SeqSession,
    UnsupportedModelError,
    decoder_start_ids,
    export_seq2seq,
    reference_generate_seq2seq,
    score_seq2seq,
)
from runtimes.litert import max_relative_error

DOC = ROOT / "docs" / "generative_families.md"
COLUMNS = ["family", "task", "status", "max logit err", "size", "latency"]
TOLERANCE = 1e-4


def family_row(
    family: str, task: str, model, source, prompt, new_tokens: int, reference=None, **export_options
) -> list[str]:
    """One table row: export, greedy generation in LiteRT against transformers
    (`reference`: reference_generate_seq2seq's extra options)."""
    try:
        edge = export_seq2seq(model, progress=False, **export_options)
    except UnsupportedModelError as e:
        return [family, task, f"refused: {str(e).split(': ', 1)[-1]}", "-", "-", "-"]
    want, want_rows = reference_generate_seq2seq(
        model, source, new_tokens, decoder_prompt=prompt, return_logits=True, **(reference or {})
    )
    session = Seq2SeqSession(edge, source)
    for token in prompt[:-1]:
        session.step(token)
    got, times, token = [], [], prompt[-1]
    for _ in range(new_tokens):
        start = time.perf_counter()
        row = session.step(token)
        times.append(time.perf_counter() - start)
        error = max_relative_error(row, want_rows[len(got)])
        token = int(np.argmax(row))
        got.append((token, error))
    tokens, errors = [t for t, _ in got], [e for _, e in got]
    exact = tokens == want and max(errors) <= TOLERANCE
    status = "exact" if exact else f"differs ({sum(a == b for a, b in zip(tokens, want))}/{new_tokens} tokens)"
    return [
        family,
        task,
        f"{status}, {new_tokens} steps",
        f"{max(errors):.0e}",
        f"{len(edge) / 1e6:.2f} MB",
        f"{statistics.median(times) * 1e3:.2f} ms/token",
    ]


def tiny_rows(new_tokens: int, families=None) -> list[list[str]]:
    from benchmarks.families.seq2seq import (
        CACHE,
        FAMILIES,
        build,
        reference_options,
        source_for,
        source_len_for,
    )

    rows = []
    for family in families or FAMILIES:
        model = build(family)
        speech = {"input_features", "input_values"} & set(inspect.signature(model.forward).parameters)
        task = "speech-to-text (tiny config)" if speech else "seq2seq text (tiny config)"
        prompt = decoder_start_ids(model)
        options = dict(cache_len=CACHE, source_len=source_len_for(model), reference=reference_options(model))
        rows.append(family_row(family, task, model, source_for(model), prompt, new_tokens, **options))
    return rows


def quantized_row(family: str, task: str, model, source, prompt, new_tokens: int, quant_config, **options):
    """A quantized variant: its logits along transformers' float tokens (teacher forcing),
    and how many of its own greedy tokens equal them."""
    want, want_rows = reference_generate_seq2seq(model, source, new_tokens, decoder_prompt=prompt, return_logits=True)
    edge = export_seq2seq(model, progress=False, verify=False, quant_config=quant_config, **options)
    got = score_seq2seq(edge, source, prompt + want[:-1])[len(prompt) - 1 :]
    error = max(max_relative_error(g, w) for g, w in zip(got, want_rows))
    session = Seq2SeqSession(edge, source)
    for token in prompt[:-1]:
        session.step(token)
    tokens, times, token = [], [], prompt[-1]
    for _ in range(new_tokens):
        start = time.perf_counter()
        token = int(np.argmax(session.step(token)))
        times.append(time.perf_counter() - start)
        tokens.append(token)
    equal = sum(a == b for a, b in zip(tokens, want))
    return [
        family,
        task,
        f"quantized: {equal}/{new_tokens} greedy tokens equal",
        f"{error:.0e}",
        f"{len(edge) / 1e6:.2f} MB",
        f"{statistics.median(times) * 1e3:.2f} ms/token",
    ]


def real_rows(new_tokens: int) -> list[list[str]]:
    import seq2seq_generate

    from litert_torch import quantize

    rows = []
    for name, task in (("whisper-tiny", "speech-to-text, 3000 mel frames"), ("t5-small", "seq2seq text, source 64")):
        model, source, prompt, options = seq2seq_generate.build(name, "real")
        rows.append(family_row(f"{name} shape", task, model, source, prompt, new_tokens, **options))
        for label, config in (
            ("dynamic int8", quantize.dynamic_int8()),
            ("int4 block 32", quantize.weight_only_int4(32)),
        ):
            row = quantized_row(f"{name} shape, {label}", task, model, source, prompt, new_tokens, config, **options)
            rows.append(row)
    return rows


FORMS = ("matmul", "sdpa")


def attention_ab(steps: int = 60) -> list[list[str]]:
    """Decode step time of the attention forms (`seq2seq.ATTENTION_FORM`) on the real
    shapes: thread CPU time (the 1-thread interpreter runs on this thread), median over
    `steps` steps interleaved (A B B A ...)."""
    import seq2seq_generate

    from litert_torch.generative import seq2seq

    rows, default = [], seq2seq.ATTENTION_FORM
    for name in ("whisper-tiny", "t5-small"):
        model, source, prompt, options = seq2seq_generate.build(name, "real")
        sessions = {}
        for form in FORMS:
            seq2seq.ATTENTION_FORM = form
            edge = export_seq2seq(model, progress=False, verify=False, **options)
            sessions[form] = Seq2SeqSession(edge, source)
            for token in prompt:
                sessions[form].step(token)
        seq2seq.ATTENTION_FORM = default
        logits = {f: [] for f in sessions}
        steppers = [lambda s=sessions[f], out=logits[f]: out.append(s.step(5)) for f in FORMS]
        # the interpreter's one thread is this one: its CPU time, robust to load
        medians = median_ms(steppers, steps, time.thread_time, warmup=0)
        diff = max(max_relative_error(a, b) for f in FORMS for a, b in zip(logits[f], logits["matmul"]))
        ms = dict(zip(FORMS, medians))
        ratios = [f"{ms[f]:.2f} ms ({ms[f] / ms['matmul']:.2f}x)" for f in FORMS]
        rows.append([name, *ratios, f"{diff:.0e}"])
    print("| model | " + " | ".join(f"{f} (CPU per step)" for f in FORMS) + " | logits differ by |")
    print("|" + " --- |" * (len(FORMS) + 2))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return rows


def table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def doc_rows(text: str) -> list[list[str]]:
    """The rows of the table between `<!-- seq2seq table -->` and `<!-- /seq2seq table -->`."""
    start, end = text.index("<!-- seq2seq table -->"), text.index("<!-- /seq2seq table -->")
    rows = []
    for line in text[start:end].splitlines()[1:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(COLUMNS) and cells != COLUMNS and not set(cells[0]) <= set("- "):
            rows.append(cells)
    return rows


def write_rows(rows: list[list[str]]) -> None:
    text = DOC.read_text()
    kept = doc_rows(text)
    new = {row[0]: row for row in rows}
    merged = [new.pop(row[0], row) for row in kept] + list(new.values())
    start, end = text.index("<!-- seq2seq table -->"), text.index("<!-- /seq2seq table -->")
    DOC.write_text(text[:start] + "<!-- seq2seq table -->\n" + table(merged) + "\n" + text[end:])


def main(argv=None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="also the Whisper-tiny and T5-small shapes")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(ROOT)}")
    parser.add_argument("--attention-ab", action="store_true", help="only time the two attention forms")
    parser.add_argument("--family", action="append", help="only this tiny family (repeatable)")
    args = parser.parse_args(argv)
    if args.attention_ab:
        return attention_ab()
    rows = tiny_rows(args.new_tokens, args.family) + (real_rows(min(args.new_tokens, 60)) if args.real else [])
    print(table(rows))
    if args.write:
        write_rows(rows)
    return rows


if __name__ == "__main__":
    main()
