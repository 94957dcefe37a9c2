"""Subprocess worker for the hostile-file fuzz: load, inspect and run each file it is given.

    python -m tests.reliability.load_worker FILE...

For each file it prints `BEGIN <i>` before touching it and `END <i> <outcome> <detail>`
after, flushing both, so a parent that sees the process die knows which file killed it.
Outcomes: `ran` (a valid model that loaded and ran on zeros), `rejected` (a clean
InvalidModelError/ValueError from `litert_torch.load`), `runtime-error` (the interpreter
raised a Python exception while building or running), `inspect-failed` (`litert-torch
inspect` returned non-zero after a successful load: a finding), `unexpected` (any other
exception type: a finding).
"""

from __future__ import annotations

import contextlib
import io
import sys

import numpy as np


def _zeros(spec) -> np.ndarray:
    shape = tuple(max(d, 1) for d in spec.shape)
    return np.zeros(shape, spec.dtype)


def check_file(path: str) -> tuple[str, str]:
    import litert_torch
    from litert_torch import cli
    from runtimes.verify import InvalidModelError

    try:
        edge = litert_torch.load(path)
    except (InvalidModelError, ValueError) as e:
        return "rejected", f"{type(e).__name__}: {e}"
    # litert-torch inspect must agree with load: a verified file inspects cleanly
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = cli.main(["inspect", path])
        except Exception as e:  # noqa: BLE001  (any exception here is a finding)
            return "unexpected", f"inspect raised {type(e).__name__}: {e}"
    if code != 0:
        return "inspect-failed", err.getvalue()
    try:
        for sig in edge.signatures:
            if any(np.prod([max(d, 1) for d in s.shape]) > 1 << 24 for s in sig.inputs):
                return "runtime-error", "inputs too large to feed"  # a legal but huge shape
            edge(*[_zeros(s) for s in sig.inputs], signature_name=sig.key)
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        return "runtime-error", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001
        return "unexpected", f"{type(e).__name__}: {e}"
    return "ran", ""


def main(paths: list[str]) -> None:
    import warnings

    warnings.simplefilter("ignore")
    for i, path in enumerate(paths):
        print(f"BEGIN {i}", flush=True)
        outcome, detail = check_file(path)
        detail = " ".join(detail.split())[:300]
        print(f"END {i} {outcome} {detail}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
