"""Deployment targets: profiles (what each runtime accepts) and the check.

    from runtimes.targets import check
    report = check("model.tflite", "android-gpu")   # prints every rule broken, why, what to do

The check reads any .tflite file through `read_model` (this package's own flatbuffer
view), never the converter's IR. `litert_torch.convert(..., target="web")` calls
`get_profile` before any work; after quantization the profile's rewrites
(`converter.passes.target_rewrites`) run on the IR, the model is written once and its
bytes checked (`litert_torch.targets.prepare_for_target`). A model that breaks a rule
with severity "error" raises `TargetError` (its message is the report) unless
`target_check="warn"`; the report is `edge.target_report`.
"""

from __future__ import annotations

from runtimes.targets.check import TargetError, TargetReport, Violation, check, check_view
from runtimes.targets.model_view import read_model
from runtimes.targets.profiles import PROFILES, Profile, get_profile

CHECK_MODES = ("error", "warn")

__all__ = [
    "PROFILES",
    "Profile",
    "TargetError",
    "TargetReport",
    "Violation",
    "check",
    "check_view",
    "get_profile",
    "read_model",
    "CHECK_MODES",
]
