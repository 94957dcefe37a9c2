"""Which line of the user's code made a graph node, or raised during export.

A node's stack trace (torch.export records one per node) names every frame; the user's
line is the innermost one outside torch, the standard library and this project's own
packages (`_own_package_dirs`; another library's line, transformers' modeling code,
counts). The pipeline puts it in unsupported-op reports and export errors; the runtime
checks (`lowering/runtime_checks.py`) name the line of a check the sample breaks.
"""

from __future__ import annotations

import functools
import os
import re
import sysconfig

import torch


def _own_package_dirs(root: str) -> tuple[str, ...]:
    """This project's own packages (every package beside `converter`, except `tests`,
    whose frames stand for a user's code): their frames are never "the user's line".
    Installed, they sit in site-packages, which counts as library code anyway."""
    if os.sep + "site-packages" + os.sep in root + os.sep:
        return ()
    return tuple(
        os.path.join(root, name) + os.sep
        for name in sorted(os.listdir(root))
        if name != "tests" and os.path.isfile(os.path.join(root, name, "__init__.py"))
    )


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder holding `converter`
_OWN_DIRS = _own_package_dirs(_ROOT)


# One frame of a formatted stack trace; the code line is absent for <stdin>-like files.
_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>[^\n]+)'
    r'(?:\n(?!\s*File ")(?P<code>[^\n]*))?'
)


_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def _is_library_frame(path: str) -> bool:
    """Frames never shown as the source of an op: torch itself, the Python standard
    library and this project's own packages. Other libraries (transformers, timm) count:
    their line is the one that made the op."""
    if path.startswith("<"):
        return False  # <stdin>, <string>: typed by the user
    norm = os.path.abspath(path)
    if os.sep + "torch" + os.sep in norm or (
        norm.startswith(_STDLIB) and os.sep + "site-packages" + os.sep not in norm
    ):
        return True
    return norm.startswith(_OWN_DIRS)


def _frame_text(frame: re.Match) -> str:
    code = (frame.group("code") or "").strip()
    text = f"{_shown_path(frame.group('file'))}:{frame.group('line')} in {frame.group('fn').strip()}"
    return f"{text}: {code}" if code else text


def user_source(node: torch.fx.Node) -> str | None:
    """`file:line in fn: code` of the innermost frame of the node's stack trace outside
    torch, the standard library and this project: the line that made the op (for a
    transformers model, the line in its modeling_*.py). With LITERT_TORCH_SOURCE_CHAIN=1,
    every such frame, outermost first, joined by " -> "."""
    return source_of(node.meta.get("stack_trace") or "", *source_settings())


def source_settings() -> tuple[bool, str]:
    """What `user_source` reads besides the node: whether to give the chain, and the cwd."""
    return os.environ.get("LITERT_TORCH_SOURCE_CHAIN", "") not in ("", "0"), os.getcwd()


@functools.lru_cache(maxsize=4096)
def source_of(trace: str, chain: bool, cwd: str) -> str | None:
    # Cached: the layers of a model called in a loop share one trace text per line.
    frames = [f for f in _FRAME.finditer(trace) if not _is_library_frame(f.group("file"))]
    if not frames:
        return None
    if chain:
        return " -> ".join(_frame_text(f) for f in frames)
    return _frame_text(frames[-1])


def user_frame_of(error: Exception) -> str | None:
    """The user's line where export failed: the deepest user frame of the traceback
    (non-strict export runs forward() in Python), else the last user frame quoted in
    the message (strict export reports "from user code: File ...")."""
    tb, found = error.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_library_frame(code.co_filename):
            found = (code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    if found is not None:
        import linecache

        path, line, fn = found
        text = linecache.getline(path, line).strip()
        return f"{_shown_path(path)}:{line} in {fn}" + (f": {text}" if text else "")
    frames = [f for f in _FRAME.finditer(str(error)) if not _is_library_frame(f.group("file"))]
    if frames:
        f = frames[-1]
        code = (f.group("code") or "").strip()
        return f"{_shown_path(f.group('file'))}:{f.group('line')} in {f.group('fn').strip()}" + (
            f": {code}" if code else ""
        )
    return None


def _shown_path(path: str) -> str:
    return _shown_path_from(path, os.getcwd())


@functools.lru_cache(maxsize=1024)
def _shown_path_from(path: str, cwd: str) -> str:
    # Cached: asked for every frame of every node's stack trace (os.path.relpath is slow).
    if path.startswith("<"):
        return path
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path
