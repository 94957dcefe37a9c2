"""Files written whole or not at all: `write_atomic`, the project's one atomic-write helper."""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Iterable


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
