"""AOTAutograd's cache for `torch.compile(backend="tpu")`: a second process skips
AOTAutograd's trace and partition.

PyTorch's `AOTAutogradCache` stores what AOTAutograd made of a Dynamo graph (forward and
backward graphs, runtime metadata) keyed by the Dynamo graph, the example inputs'
metadata, PyTorch's version and configuration. It serves any compiler that returns a
picklable `OutputCode` (`SerializableAOTDispatchCompiler`) when entries are *bundled*
(`torch._functorch.config.bundled_autograd_cache`; checked against torch 2.13):
`TpuGraphCode` is ours. It keeps the ATen graph as AOTAutograd gave it (before our own
passes, which depend on the kernel mode) and rebuilds the device callable from it on a
hit (`post_compile`); the program itself then comes from the lowered-program cache
(`program_cache.py`) or JAX's persistent cache.

`compiling()` is entered around each AOTAutograd call of the backend. It

- makes entries bundled and lowers the backward graph at once, so the entry is complete
  when AOTAutograd saves it (a lazily lowered backward would be saved later, outside
  this scope);
- adds this project's source hash, lowering-table size and kernel mode to the key
  (`torch.compiler.config.cache_key_tag`): PyTorch's key does not cover the
  decompositions we pass, which follow our lowering table;
- stores entries in `<cache folder>/aotautograd/<key>/*.aot` through `VerifiedDiskCache`
  instead of PyTorch's unchecked pickles under `/tmp`: a corrupt entry, or one that no
  longer unpickles, is deleted with a warning and rebuilt.

PyTorch's own storage functions are swapped only inside the scope (Dynamo compiles one
graph at a time), so inductor's caches elsewhere in the process are untouched. The
layer is off when the disk cache is (`TPU_CACHE_DIR=off`) or with `TPU_AOT_CACHE=off`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from typing import Any, Sequence

import torch
from torch._functorch._aot_autograd import autograd_cache as _aot_cache
from torch._functorch._aot_autograd.aot_autograd_result import SerializedGraphModule
from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
from torch._inductor.output_code import OutputCode

from tpu_backend.compile import cache as _cache
from tpu_backend.compile import program_cache

SUFFIX = ".aot"
DEFAULT = "default"  # the process-wide bucket policy (pickles, unlike backend's sentinel)


def enabled() -> bool:
    return (
        _cache.cache_dir() is not None
        and os.environ.get("TPU_AOT_CACHE", "on").strip().lower() not in _cache._DISABLED_VALUES
    )


class TpuGraphCode(OutputCode):
    """One AOTAutograd graph compiled for the tpu device, in the form AOTAutograd's cache
    can store: the graph (pickled as code) and the program name; the compiled callable is
    rebuilt after loading."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, buckets):
        self.graph = SerializedGraphModule(gm)  # now: compile_for_tpu rewrites gm in place
        self.inputs = _describe_inputs(gm)  # None: symbolic sizes, not stored
        self.name = name
        self.buckets = buckets
        self._boxed_call = True
        self._compiled = None
        # A stored graph is compiled as a later process will load it (pickling re-traces
        # the code: names change, argument-free subexpressions become constants), so that
        # both processes build the same program and share its lowered-program entry.
        restored = None
        if self.inputs is not None:
            try:
                restored = restore_graph(self.graph, self.inputs)
            except Exception:  # noqa: BLE001 - e.g. control flow subgraphs do not re-trace: not stored
                self.inputs = None
        self._compile(restored if restored is not None else gm)

    def _compile(self, gm: torch.fx.GraphModule) -> None:
        from tpu_backend.compile import backend

        buckets = backend._DEFAULT_BUCKETS if self.buckets == DEFAULT else self.buckets
        self._compiled = backend.compile_for_tpu(gm, self.name, buckets)

    def __call__(self, args: list) -> list:
        return self._compiled(args)

    def prepare_for_serialization(self) -> None:
        if self.inputs is None:
            raise _aot_cache.BypassAOTAutogradCache("tpu: graph not stored (symbolic sizes, or it does not re-trace)")
        self._compiled = None  # device programs do not pickle; post_compile rebuilds them

    def post_compile(self, example_inputs: Sequence[Any], constants, graph_kwargs) -> None:
        self._compile(restore_graph(self.graph, self.inputs))

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


def _describe_inputs(gm: torch.fx.GraphModule) -> list | None:
    """Each placeholder's value as (shape, stride, storage offset, dtype, device) for a
    tensor, or the plain Python value; None when any size is symbolic."""
    described = []
    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            sizes = (*value.shape, *value.stride(), value.storage_offset())
            if not all(isinstance(d, int) for d in sizes):
                return None
            described.append(
                (tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype, value.device)
            )
        elif value is None or isinstance(value, (bool, int, float)):
            described.append(value)
        else:
            return None
    return described


def restore_graph(graph: SerializedGraphModule, inputs: list) -> torch.fx.GraphModule:
    """The graph as stored, rebuilt with the FakeTensor metadata (`meta["val"]`) its nodes
    had when AOTAutograd made it: pickling drops it, and the backend reads it (output
    devices and dtypes, input fast paths, the norm-fusion pass). Rebuilding re-traces the
    graph's code, which computes argument-free subexpressions (a causal mask) as real
    constants: outside any fake mode, and on a copy of the stored attributes."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    body, *rest = graph.args
    with unset_fake_temporarily():
        gm = graph.fn(dict(body), *rest)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        values = [
            torch.empty_strided(v[0], v[1], dtype=v[3], device=v[4]).as_strided(v[0], v[1], v[2])
            if isinstance(v, tuple)
            else v
            for v in inputs
        ]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*values)
    return gm


def compiler(name: str, buckets=DEFAULT):
    """An AOTAutograd compiler naming its program `name`, cacheable by AOTAutograd when
    this layer is on."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> TpuGraphCode:
        return TpuGraphCode(gm, name, buckets)

    compile_graph.__name__ = f"tpu_compiler_{name}"
    return SerializableAOTDispatchCompiler(TpuGraphCode, compile_graph)


def key_tag() -> str:
    """What of ours decides AOTAutograd's output: the decompositions follow the lowering
    table (its code and size) and the kernel mode."""
    from tpu_backend import kernels
    from tpu_backend.compile.interpreter import lowering_tables_version

    return f"tpu_backend {program_cache.source_hash()} {lowering_tables_version()} {kernels.mode()}"


# --------------------------------------------------------------------- verified storage


def _store_for(key: str) -> _cache.VerifiedDiskCache:
    return _cache.VerifiedDiskCache(_cache.cache_dir() / "aotautograd" / key, SUFFIX, refuse_in_cache_only=False)


def _write_to_local_cache(key: str, content: bytes) -> None:
    _store_for(key).put(hashlib.sha256(content).hexdigest()[:32], content)


def _iterate_over_candidates(cls, local: bool, remote_cache, key: str):
    """PyTorch's candidates for `key` (`GuardedCache.iterate_over_candidates`), from our
    verified store; remote caches are not consulted."""
    if not local:
        return
    storage = _store_for(key)
    for path in storage.entries():
        name = path.name[: -len(SUFFIX)]
        content = storage.get(name)  # None: corrupt, deleted with a warning
        if content is None:
            continue
        try:
            entry = pickle.loads(content)
        except Exception as error:  # noqa: BLE001 - an entry this PyTorch cannot read: rebuild it
            storage.discard(name, f"does not unpickle ({type(error).__name__})")
            continue
        yield entry, content, True


class _Swap:
    """Set attributes of objects for a block, then put the old values back."""

    def __init__(self, *changes: tuple[Any, str, Any]):
        self.changes = changes
        self.saved: list[tuple[Any, str, Any]] = []

    def __enter__(self):
        for owner, name, value in self.changes:
            # an inherited attribute is shadowed, then unshadowed (not copied down)
            self.saved.append((owner, name, owner.__dict__.get(name, _INHERITED)))
            setattr(owner, name, value)
        return self

    def __exit__(self, *exc):
        for owner, name, value in reversed(self.saved):
            if value is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        self.saved.clear()
        return False


_INHERITED = object()


_HOOKS = ("_write_to_local_cache", "iterate_over_candidates")


@contextlib.contextmanager
def compiling():
    """The scope of one AOTAutograd call of the backend (see the module docstring)."""
    if not enabled():
        yield
        return
    cls = _aot_cache.AOTAutogradCache
    missing = [name for name in _HOOKS if not hasattr(cls, name)]
    if missing:  # another torch: no AOTAutograd cache rather than a broken one
        yield
        return
    tag = torch.compiler.config.cache_key_tag
    with (
        torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True),
        torch.compiler.config.patch(cache_key_tag=f"{tag}|{key_tag()}" if tag else key_tag()),
        _Swap(
            (cls, "_write_to_local_cache", staticmethod(_write_to_local_cache)),
            (cls, "iterate_over_candidates", classmethod(_iterate_over_candidates)),
        ),
    ):
        yield


def counters() -> dict[str, int]:
    """AOTAutograd's cache counters in this process (hit, miss, saved, bypass)."""
    from torch._dynamo.utils import counters as torch_counters

    found = torch_counters["aot_autograd"]
    return {name: found.get(f"autograd_cache_{name}", 0) for name in ("hit", "miss", "saved", "bypass")}


__all__ = ["TpuGraphCode", "compiler", "compiling", "counters", "enabled", "key_tag"]
