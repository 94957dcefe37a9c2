"""What every `litert-torch` subcommand shares (`cli.py`, `runtime_commands.py`): the exit
codes and the table of a target check's violations."""

from __future__ import annotations

import os

# Exit codes of every subcommand: 0 done (a check passed), 1 the model or a check failed (a
# file that is not a valid LiteRT model included), 2 bad usage (no such file, a folder, an
# unwritable output path, bad arguments).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def output_path_error(path: str) -> str | None:
    """Why a file cannot be written at `path` (`common.files.check_output_path`), or None:
    checked before converting or benchmarking, which take a while."""
    from common.files import check_output_path

    try:
        check_output_path(path)
    except OSError as e:
        return str(e)
    return None


def model_file_error(path: str) -> tuple[int, str] | None:
    """Why `path` cannot be read as a LiteRT model, and the exit code that says so: none
    (None), no such file or a folder (EXIT_USAGE), not a valid model (EXIT_FAILED: no TFL3
    identifier, or damaged; `runtimes.verify` names the part)."""
    from runtimes.verify import InvalidModelError, verify_model

    if os.path.isdir(path):
        return EXIT_USAGE, f"{path} is a folder, not a .tflite file"
    if not os.path.isfile(path):
        return EXIT_USAGE, f"no such file: {path}"
    try:
        with open(path, "rb") as f:
            content = f.read()
    except OSError as e:
        return EXIT_USAGE, f"cannot read {path}: {e.strerror}"
    if content[4:8] != b"TFL3":
        return EXIT_FAILED, f"{path} is not a LiteRT/TFLite model (no TFL3 identifier)"
    try:
        verify_model(content, path)  # bounds and indices, before anything follows an offset
    except InvalidModelError as e:
        return EXIT_FAILED, str(e)
    return None


def group_violations(violations) -> list[tuple[str, int, object]]:
    """(op type, count, first violation) per kind of violation (severity, rule, op type,
    fix), in order of first appearance: a float model checked for a microcontroller is one
    row per op type, not one per op."""
    import re

    groups: dict[tuple, list] = {}
    for v in violations:
        match = re.search(r"op #\d+ (\S+)", v.where)
        kind = match.group(1) if match else ("tensor" if ": tensor" in v.where else "model")
        groups.setdefault((v.severity, v.rule, kind, v.fix), []).append(v)
    return [(key[2], len(found), found[0]) for key, found in groups.items()]


def print_violations(console, violations, limit: int | None = None) -> None:
    """One table row per kind of violation: op type, count, the first one (where, and its
    layer and source line when the converter knows them), why, the fix."""
    from rich.table import Table

    rows = group_violations(violations)
    table = Table(show_lines=False)
    for col in ("severity", "op", "count", "first", "why", "what to do"):
        table.add_column(col, overflow="fold", justify="right" if col == "count" else "left")
    for kind, count, first in rows[:limit]:
        where = first.where.removesuffix(f" {kind}")  # the op type has its own column
        where += f"\n{first.source}" if first.source else ""
        table.add_row(first.severity, kind, str(count), where, first.why, first.fix)
    console.print(table)
    if limit is not None and len(rows) > limit:
        console.print(f"... and {len(rows) - limit} more kinds (--limit N, or --json for every violation)")
