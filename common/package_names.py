"""This project's generic top-level import names, and what to do when another package has one.

The repository's packages `common`, `converter`, `kernels` and `runtimes` are imported by
those names. Another distribution that installs a package of the same name (Hugging Face's
`kernels`, which transformers imports whenever it is installed) cannot live in the same
environment: Python imports one of the two as `kernels`, and whichever code expected the
other fails (transformers: "cannot import name 'CUDAProperties' from 'kernels'"; this
project: "cannot import name 'tpu' from 'kernels'"). `check_top_level_names(...)` runs at
`import litert_torch` and `import tpu_backend` and turns that into one ImportError that
says which package, where, and what to do. It reads `sys.path` and the installed
distributions' metadata by name only (a few directory listings, no imports; ~1 ms).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys

GENERIC_NAMES = ("common", "converter", "kernels", "runtimes")
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PackageNameClashError(ImportError):
    pass


def _same_place(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _other_on_path(name: str) -> str | None:
    """Where a package or module `name` that is not this project's lies on sys.path, if any."""
    ours = os.path.join(PROJECT_ROOT, name)
    for entry in sys.path:
        spec = importlib.machinery.PathFinder.find_spec(name, [entry or os.curdir])
        if spec is None or spec.loader is None:  # nothing, or a namespace portion (any package wins over it)
            continue
        location = spec.submodule_search_locations[0] if spec.submodule_search_locations else spec.origin
        if not _same_place(location, ours):
            return location
    return None


def _other_distribution(name: str):
    """An installed distribution named `name` that ships a top-level `name` (not this project)."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    tops = {str(f).replace("\\", "/").split("/")[0].removesuffix(".py") for f in dist.files or ()}
    return dist if name in tops else None


def clashes() -> dict[str, str]:
    """{import name: a description of the other package that has it} (empty when none)."""
    found = {}
    for name in GENERIC_NAMES:
        dist = _other_distribution(name)
        location = _other_on_path(name)
        if dist is not None:
            where = f" ({os.path.join(str(dist.locate_file('')), name)})"
            found[name] = f"the distribution {dist.metadata['Name']!r} {dist.version}{where}"
        elif location is not None:
            found[name] = f"another package at {location}"
    return found


def clash_message(found: dict[str, str]) -> str:
    lines = ["litert-torch-tpu's top-level packages share their import names with other packages:"]
    for name, other in found.items():
        lines.append(f"  {name!r}: this project's {os.path.join(PROJECT_ROOT, name)} and {other}")
    consequence = "Python imports only one package per name, so this project or the other package's users fail"
    if "kernels" in found:
        consequence += " (transformers: \"cannot import name 'CUDAProperties' from 'kernels'\")"
    lines.append(consequence + ".")
    distributions = [other.split("'")[1] for other in found.values() if other.startswith("the distribution")]
    if distributions:
        why = " (transformers runs without Hugging Face's `kernels`: they are optional CUDA kernels from the Hub)"
        lines.append(
            f"Fix: `python -m pip uninstall {' '.join(distributions)}` in this environment"
            f"{why if 'kernels' in distributions else ''}, or install this project in a virtual environment of"
            " its own (tools/setup.sh creates .venv)."
        )
    if len(distributions) < len(found):
        lines.append("Fix: rename or move the other package (a folder or module next to your script counts).")
    return "\n".join(lines)


def _ours_is_found(name: str) -> bool:
    """Whether `import name` gets this project's package (from anywhere in the process)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return False
    return _same_place(os.path.dirname(spec.origin), os.path.join(PROJECT_ROOT, name))


def check_top_level_names(imported: tuple[str, ...]) -> None:
    """Raise PackageNameClashError when another package has one of the generic names the
    caller imports (`imported`: which one Python finds depends on sys.path order), or one of
    the others while `import name` finds ours (the other package's users then get ours:
    transformers and Hugging Face's `kernels`). A name the caller never imports, where the
    other package is the one found, harms no one (litert_torch never imports `kernels`)."""
    found = {name: other for name, other in clashes().items() if name in imported or _ours_is_found(name)}
    if found:
        raise PackageNameClashError(clash_message(found))
