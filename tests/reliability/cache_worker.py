"""Subprocess worker for the concurrent-cache test: hammer ONE entry of a shared
`VerifiedDiskCache` folder, as a writer or a reader, for a while.

    python -m tests.reliability.cache_worker FOLDER write SIZE SECONDS
    python -m tests.reliability.cache_worker FOLDER read 0 SECONDS

A writer stores payloads of SIZE bytes (every byte = SIZE % 251) under the key "shared";
a reader gets it in a loop. Prints one JSON line: operations done, misses, corrupt
entries seen (warnings) and payloads that are neither absent nor a writer's full payload.
"""

from __future__ import annotations

import json
import sys
import time
import warnings


def _cache_module():
    """tpu_backend/compile/cache.py loaded on its own (it needs only jax): importing the
    tpu_backend package would cost a torch import per worker."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "tpu_backend", "compile", "cache.py")
    spec = importlib.util.spec_from_file_location("tpu_cache_standalone", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(folder: str, role: str, size: int, seconds: float) -> None:
    cache = _cache_module().VerifiedDiskCache(folder)
    done = misses = torn = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        end = time.perf_counter() + seconds
        payload = bytes([size % 251]) * size
        while time.perf_counter() < end:
            if role == "write":
                cache.put("shared", payload)
            else:
                got = cache.get("shared")
                if got is None:
                    misses += 1
                elif len(set(got)) != 1 or got[0] != len(got) % 251:
                    torn += 1
            done += 1
    corrupt = sum("corrupt or truncated" in str(w.message) for w in caught)
    print(json.dumps({"role": role, "operations": done, "misses": misses, "torn": torn, "corrupt": corrupt}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
