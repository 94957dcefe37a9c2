"""Deployment targets: profiles (what each runtime accepts), rewrites, and the check.

    from runtimes.targets import check
    report = check("model.tflite", "android-gpu")   # prints every rule broken, why, what to do

`litert_torch.convert(..., target="web")` calls `get_profile` before any work and
`prepare_for_target` after quantization: the profile's rewrites run on the IR, then the
check. A model that breaks a rule with severity "error" raises `TargetError` (its
message is the report) unless `target_check="warn"`; the report is `edge.target_report`.
"""

from __future__ import annotations

from runtimes.targets.check import TargetError, TargetReport, Violation, check, check_view
from runtimes.targets.model_view import read_model
from runtimes.targets.profiles import PROFILES, Profile, get_profile
from runtimes.targets.rewrites import REWRITES

CHECK_MODES = ("error", "warn")

__all__ = ["PROFILES", "Profile", "TargetError", "TargetReport", "Violation", "check", "check_view",
           "get_profile", "prepare_for_target", "read_model"]


def prepare_for_target(model, profile, *, on_violation: str = "error"):
    """Apply `profile`'s rewrites to the IR `model`, then check it.

    Returns (model, report). With on_violation="error" (the default) a report with errors
    raises TargetError; with "warn" the report is returned as is."""
    from converter.writer import write_flatbuffer

    if on_violation not in CHECK_MODES:
        raise ValueError(f"target_check must be one of {CHECK_MODES}, got {on_violation!r}")
    profile = get_profile(profile)
    changes = []
    for name in profile.rewrites:
        changes += REWRITES[name](model)
    report = check_view(read_model(write_flatbuffer(model)), profile)
    report.rewrites = changes
    if on_violation == "error" and not report.ok:
        raise TargetError(report)
    return model, report
