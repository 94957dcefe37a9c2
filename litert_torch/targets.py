"""Deployment targets in the conversion flow: the layer that joins the converter (IR
rewrites, writer) and `runtimes.targets` (profiles, the check on bytes).

    model, report = prepare_for_target(ir_model, "android-gpu")
"""

from __future__ import annotations

import re

from converter import ir
from converter.passes.target_rewrites import apply_target_rewrites
from converter.writer import ModelParts, write_flatbuffer_parts
from runtimes.targets import CHECK_MODES, TargetError, TargetReport, check_view, get_profile, read_model


def write_for_target(model: ir.Model, profile, *, on_violation: str = "error") -> tuple[ModelParts, TargetReport]:
    """Apply `profile`'s rewrites to the IR `model` (in place), write it ONCE and check
    the bytes. Returns (the written parts, the report). The check reads the flatbuffer
    part only, so models over 2 GB are never joined in memory.

    With on_violation="error" (the default) a report with errors raises TargetError; with
    "warn" the report is returned as is."""
    if on_violation not in CHECK_MODES:
        raise ValueError(f"target_check must be one of {CHECK_MODES}, got {on_violation!r}")
    profile = get_profile(profile)
    changes = apply_target_rewrites(model, profile.rewrites)
    parts = write_flatbuffer_parts(model)
    report = check_view(read_model(parts.pieces[0], file_size=len(parts)), profile)
    report.rewrites = changes
    _attach_sources(report, model)
    if on_violation == "error" and not report.ok:
        raise TargetError(report)
    return parts, report


def _attach_sources(report: TargetReport, model: ir.Model) -> None:
    """Each violation at an op gets the layer (and source line, when recorded) of the IR op
    it was written from: the writer keeps each graph's op order, checked by opcode."""
    graphs = {graph.name: graph for graph in model.graphs}
    for violation in report.violations:
        match = re.fullmatch(r"(.+): op #(\d+) (\S+)", violation.where)
        graph = graphs.get(match.group(1)) if match else None
        index = int(match.group(2)) if match else -1
        if graph is None or index >= len(graph.ops) or graph.ops[index].opcode != match.group(3):
            continue
        op = graph.ops[index]
        violation.source = ", ".join(part for part in (op.module, op.source) if part)


def prepare_for_target(model: ir.Model, profile, *, on_violation: str = "error") -> tuple[ir.Model, TargetReport]:
    """Apply `profile`'s rewrites to the IR `model`, then check it; returns (model, report)."""
    _, report = write_for_target(model, profile, on_violation=on_violation)
    return model, report
