"""Debug dumps: what each compiled program was built from and what XLA was given.

`dump(folder)` (or the environment variable `TPU_DUMP_DIR`) makes every program compiled
from then on write, into `folder`:

- `<program>.<n>.stablehlo.mlir`: the StableHLO handed to XLA for its n-th signature
  (the signature is the first comment line);
- `<program>.fx.py`: the source the program came from (for `torch.compile`, the ATen FX
  graph AOTAutograd produced), once per program.

`dump(None)` stops. `dump(folder)` also works as a context manager that restores the
previous setting on exit.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ENV_DUMP_DIR = "TPU_DUMP_DIR"

_dump_dir: Path | None = None
_from_env = True  # until dump() is called, follow the environment variable
_counts: dict[str, int] = {}


def dump_dir() -> Path | None:
    """The folder dumps go to now, or None."""
    if _from_env:
        env = os.environ.get(ENV_DUMP_DIR)
        return Path(env).expanduser() if env else None
    return _dump_dir


class dump:  # noqa: N801  (used like a function: `dump(dir)`)
    """Write every program compiled from now on into `folder` (None: stop dumping)."""

    def __init__(self, folder: str | os.PathLike | None):
        global _dump_dir, _from_env
        self._previous = (_dump_dir, _from_env)
        _dump_dir = None if folder is None else Path(folder).expanduser()
        _from_env = False

    def __enter__(self) -> Path | None:
        return _dump_dir

    def __exit__(self, *exc) -> None:
        global _dump_dir, _from_env
        _dump_dir, _from_env = self._previous


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def write_program(name: str, signature: str, lowered, source) -> None:
    """Write one compiled signature (and, the first time, the program's source: a string
    or a function returning one, called only when dumping)."""
    folder = dump_dir()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    stem = _safe(name)
    index = _counts.get(stem, 0)
    _counts[stem] = index + 1
    text = f"// program {name}, signature {signature}\n" + lowered.as_text()
    (folder / f"{stem}.{index}.stablehlo.mlir").write_text(text)
    source_file = folder / f"{stem}.fx.py"
    if source is not None and not source_file.exists():
        source_file.write_text(source() if callable(source) else source)


__all__ = ["ENV_DUMP_DIR", "dump", "dump_dir", "write_program"]
