"""Files written whole or not at all: `write_atomic`, the project's one atomic-write helper,
and `check_output_path`, what a writer checks before the work that produces the bytes."""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Iterable


def check_output_path(path: str | os.PathLike) -> None:
    """Raise the OSError a write to `path` would meet, naming it: its folder missing
    (FileNotFoundError) or a file (NotADirectoryError), `path` a folder (IsADirectoryError),
    the folder not writable (PermissionError). Callers check before a long job (a
    conversion) so that it does not end in a traceback."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise NotADirectoryError(f"cannot write {path}: {folder} is a file, not a folder")
        raise FileNotFoundError(f"cannot write {path}: folder {folder} does not exist (create it first)")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path}: it is a folder; give a file name like {path}/model.tflite")
    if not os.access(folder, os.W_OK):
        raise PermissionError(f"cannot write {path}: folder {folder} is not writable")


def write_atomic(
    path: str | os.PathLike, pieces: Iterable[bytes], *, prefix: str = ".tmp-", suffix: str = ".tmp", fsync: bool = True
) -> str:
    """Write the concatenated `pieces` to `path` atomically and return `path`.

    The bytes go to a hidden temporary file in `path`'s folder (`prefix`, random letters,
    `suffix`), are flushed (and fsync'ed), then `os.replace` it over `path`: a reader never
    sees a partial file, and a failure (disk full, an exception, Ctrl-C) leaves nothing
    behind. The temporary is created with mode 0o666, so the file's mode follows the umask
    as `open(path, "wb")`'s does; `tempfile.mkstemp`'s 0o600 would survive the rename and
    leave an owner-only file. An error creating the temporary names `path` and its folder."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:  # another writer drew the same name: draw again
            continue
        except PermissionError as e:
            raise PermissionError(
                f"cannot write {path}: no permission to create files in {folder} ({e.strerror})"
            ) from e
        except OSError as e:
            raise OSError(e.errno, f"cannot write {path}: cannot create a file in {folder} ({e.strerror})") from e
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
