"""`torch.compile(backend="tpu")` and the compilation cache.

Importing this package registers the Dynamo backend "tpu". Public API:

- `fx_to_jax(gm)`, `compile_graph(gm, name)`: run an ATen FX graph through the lowering
  table as a JAX function / as a cached jitted `Program`;
- `compile_stats()`: requests, hits, disk hits, misses and compile seconds per program;
  `record_compile(name, seconds, from_disk)` for compile paths outside `Program`;
- `set_cache_dir(path)` (or `$TPU_CACHE_DIR`; default `~/.cache/tpu_backend/xla`):
  JAX's persistent compilation cache, with checksummed entries (`verify_cache()`);
  `using_cache_dir(path)` for a block;
- `cache_only()`: a context in which any compile raises `CacheMissError`;
- `dump(folder)` (or `$TPU_DUMP_DIR`): write each compiled program's StableHLO and the
  FX graph it came from;
- `find_divergence(fn, *args)`: the nodes of `fn`'s compiled graphs whose values differ
  from the same graphs run op by op in eager mode (a compiler bug's first trace);
- `compiles_ahead()` (`TPU_COMPILE_AHEAD`=auto|on|off; auto: on for a TPU): a graph's
  program compiles on a thread from when AOTAutograd hands it over, the backward with the
  forward, instead of at its first call (`compiled_graph.py`);
- `programs()`: the compiled programs alive now; `Program.export(platforms=("tpu",))`
  lowers each of a program's signatures for another platform (`jax.export.Exported`).
- `scan_layers(blocks)`: a model's repeated blocks (decoder layers) compiled once, as one
  `lax.scan` over their stacked parameters, forward and backward (`scan.py`); `unmark`.
- `save_matmuls`: a `context_fn` for `torch.utils.checkpoint` that keeps a block's matrix
  products and recomputes the rest (`remat.py`).
- `dynamo_cache.enable()` (or `TPU_DYNAMO_CACHE=on`): Dynamo's output stored with the
  rest, so a second process skips Dynamo's trace too (opt-in: `dynamo_cache.py`).
- `dynamic`: graphs with symbolic sizes (`dynamic=True`, `mark_dynamic`) are padded to
  buckets (`dynamic.set_buckets`, `using_buckets`, or `options={"buckets": [...]}`).
"""

from __future__ import annotations

from tpu_backend.compile import dynamo_cache
from tpu_backend.compile.backend import BACKEND_NAME, DynamicShapesNotSupported, compiles_ahead, decompositions
from tpu_backend.compile.cache import (
    CacheMissError,
    CompileStats,
    ProgramStats,
    cache_dir,
    cache_only,
    compile_stats,
    disk_cache,
    ensure_persistent_cache,
    record_compile,
    record_hit,
    set_cache_dir,
    using_cache_dir,
    verify_cache,
)
from tpu_backend.compile.divergence import Divergence, find_divergence
from tpu_backend.compile.dump import dump, dump_dir
from tpu_backend.compile.interpreter import (
    GraphFunction,
    UnsupportedGraphError,
    compile_graph,
    fx_to_jax,
    missing_lowerings,
)
from tpu_backend.compile.program import Program, programs
from tpu_backend.compile.remat import save_matmuls
from tpu_backend.compile.scan import scan_layers, unmark

if dynamo_cache.requested():  # TPU_DYNAMO_CACHE=on: a second process skips Dynamo's trace too
    dynamo_cache.enable()

__all__ = [
    "BACKEND_NAME",
    "CacheMissError",
    "CompileStats",
    "Divergence",
    "DynamicShapesNotSupported",
    "GraphFunction",
    "Program",
    "ProgramStats",
    "UnsupportedGraphError",
    "cache_dir",
    "cache_only",
    "compile_graph",
    "compile_stats",
    "compiles_ahead",
    "decompositions",
    "disk_cache",
    "dump",
    "dump_dir",
    "ensure_persistent_cache",
    "find_divergence",
    "fx_to_jax",
    "missing_lowerings",
    "programs",
    "record_compile",
    "record_hit",
    "save_matmuls",
    "scan_layers",
    "set_cache_dir",
    "using_cache_dir",
    "unmark",
    "verify_cache",
]
