"""What every `litert-torch` subcommand shares (`cli.py`, `runtime_commands.py`): the exit
codes and the table of a target check's violations."""

from __future__ import annotations

# Exit codes of every subcommand: 0 done (a check passed), 1 the model or a check failed,
# 2 bad usage (missing file, bad arguments).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


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
