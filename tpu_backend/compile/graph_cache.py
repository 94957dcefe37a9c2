"""AOTAutograd's cache for `torch.compile(backend="tpu")`: a second process skips
AOTAutograd's trace and partition.

PyTorch's `AOTAutogradCache` stores what AOTAutograd made of a Dynamo graph (forward and
backward graphs, runtime metadata) keyed by the Dynamo graph, the example inputs'
metadata, PyTorch's version and configuration. It serves any compiler that returns a
picklable `OutputCode` (`SerializableAOTDispatchCompiler`) when entries are *bundled*
(`torch._functorch.config.bundled_autograd_cache`; checked against torch 2.13):
`TpuGraphCode` is ours. It keeps the ATen graph as AOTAutograd gave it (before our own
passes, which depend on the kernel mode) as a `GraphRecord`, plain data with each node's
FakeTensor metadata, and rebuilds the device callable from it on a hit (`post_compile`);
the program itself then comes from the lowered-program cache (`program_cache.py`: the
rebuilt graph has the same identity as the original) or JAX's persistent cache. The
subgraphs a graph calls (`scan_layers`' blocks through `invoke_subgraph`) are stored with
it, as records of their own, and rebuilt as the same modules: the scan planner finds the
same runs. Graphs with symbolic sizes are not stored; PyTorch itself refuses graphs with
`torch.cond` or `while_loop` (not cacheable in torch 2.13), whose records would work too.

`compiling()` is entered around each AOTAutograd call of the backend. It

- makes entries bundled and lowers the backward graph at once, so the entry is complete
  when AOTAutograd saves it (a lazily lowered backward would be saved later, outside
  this scope);
- adds this project's source hash, lowering-table size and kernel mode to the key
  (`torch.compiler.config.cache_key_tag`): PyTorch's key does not cover the
  decompositions we pass, which follow our lowering table;
- stores entries in `<cache folder>/aotautograd/<key>/*.aot` through `VerifiedDiskCache`
  instead of PyTorch's unchecked pickles under `/tmp`: a corrupt entry, or one that no
  longer unpickles, is deleted with a warning and rebuilt;
- keeps the entry's copy of the backward graph (for compiled autograd) as bytes that are
  unpickled only if read (`_serialize_backward_lazily`);
- leaves inductor's code generators unimported while the key is computed
  (`_no_backend_registration`).

PyTorch's own storage functions are swapped only inside the scope (Dynamo compiles one
graph at a time), so inductor's caches elsewhere in the process are untouched. The
layer is off when the disk cache is (`TPU_CACHE_DIR=off`) or with `TPU_AOT_CACHE=off`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import os
import pickle
from typing import Any, Sequence

import torch
from torch._functorch._aot_autograd import aot_autograd_result as _aot_result
from torch._functorch._aot_autograd import autograd_cache as _aot_cache
from torch._functorch._aot_autograd import graph_compile as _graph_compile
from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
from torch._inductor import codecache as _codecache
from torch._inductor.output_code import OutputCode
from torch._subclasses.fake_tensor import unset_fake_temporarily

from tpu_backend import kernel_mode
from tpu_backend.compile import cache as _cache
from tpu_backend.compile import compiled_graph, program_cache

SUFFIX = ".aot"
DEFAULT = "default"  # the process-wide bucket policy (pickles, unlike backend's sentinel)


def enabled() -> bool:
    return (
        _cache.cache_dir() is not None
        and os.environ.get("TPU_AOT_CACHE", "on").strip().lower() not in _cache._DISABLED_VALUES
    )


class TpuGraphCode(OutputCode):
    """One AOTAutograd graph compiled for the tpu device, in the form AOTAutograd's cache
    can store: the graph as a `GraphRecord` and the program name; the compiled callable
    is rebuilt after loading."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, buckets):
        self.record = GraphRecord.of(gm)  # now: compile_for_tpu rewrites gm in place (None: not stored)
        self.name = name
        self.buckets = buckets
        self._boxed_call = True
        self._compiled = None
        self._compile(gm)

    def _compile(self, gm: torch.fx.GraphModule) -> None:
        buckets = compiled_graph._DEFAULT_BUCKETS if self.buckets == DEFAULT else self.buckets
        self._compiled = compiled_graph.compile_for_tpu(gm, self.name, buckets)

    def __call__(self, args: list) -> list:
        return self._compiled(args)

    def prepare_for_serialization(self) -> None:
        if self.record is None:
            raise _aot_cache.BypassAOTAutogradCache("tpu: graph not stored (symbolic sizes or an unknown target)")
        self._compiled = None  # device programs do not pickle; post_compile rebuilds them

    def post_compile(self, example_inputs: Sequence[Any], constants, graph_kwargs) -> None:
        self._compile(self.record.graph_module())

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


class _Unstorable(Exception):
    pass


class _Node:
    """A reference to the graph's i-th node inside a stored node's arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return (_Node, (self.index,))


class GraphRecord:
    """An ATen FX graph as plain picklable data: per node its kind, name, target (named,
    not pickled: operator overloads do not pickle), arguments and a description of its
    FakeTensor value (`meta["val"]`, which the backend reads: output devices and dtypes,
    input fast paths, the norm-fusion pass, the scan planner), plus the constant tensors
    it reads and the subgraphs it calls.

    `subgraphs`: per child module of the graph, in the graph's order, a `GraphRecord`,
    or the name of an earlier child that is the same module (the scan planner tells
    blocks apart by module identity, so sharing is kept).

    Rebuilt with `graph_module()` into the same graph, names included, without tracing
    anything (PyTorch's own GraphModule pickling re-traces the code, which renames
    nodes, turns argument-free subexpressions into constants and drops the metadata)."""

    def __init__(self, nodes: list, constants: dict, subgraphs: dict | None = None):
        self.nodes, self.constants = nodes, constants
        self.subgraphs = subgraphs or {}

    @staticmethod
    def of(gm: torch.fx.GraphModule) -> "GraphRecord | None":
        """The record of `gm` and its subgraphs, or None for a graph that cannot be stored
        (symbolic sizes, a target that is not an ATen op, a module function or a
        higher-order op the interpreter runs)."""
        try:
            return _record(gm)
        except _Unstorable:
            return None

    def graph_module(self) -> torch.fx.GraphModule:
        from torch._subclasses.fake_tensor import FakeTensorMode

        return self._build(FakeTensorMode(allow_non_fake_inputs=True))

    def _build(self, mode) -> torch.fx.GraphModule:
        children: dict[str, torch.fx.GraphModule] = {}
        for name, sub in self.subgraphs.items():
            children[name] = children[sub] if isinstance(sub, str) else sub._build(mode)
        graph = torch.fx.Graph()
        made: list[torch.fx.Node] = []
        resolve = lambda value: _map_refs(value, made)  # noqa: E731
        with mode:
            for op, name, target, args, kwargs, described in self.nodes:
                if op == "output":
                    node = graph.output(resolve(args[0]))
                else:
                    node = graph.create_node(op, _resolve_target(target), resolve(args), resolve(kwargs), name=name)
                if described is not None:
                    node.meta["val"] = _fake(described)
                made.append(node)
        root = torch.nn.Module()
        with unset_fake_temporarily():
            for target, (value, device) in self.constants.items():
                setattr(root, target, value.to(device))
        for name, child in children.items():
            setattr(root, name, child)
        gm = torch.fx.GraphModule(root, graph)
        # GraphModule copies the children its nodes read, in the order they read them: put
        # back the original order (the program's identity lists the subgraphs in it)
        for name in children:
            gm._modules.pop(name, None)
        for name, child in children.items():
            setattr(gm, name, child)
        return gm


def _record(gm: torch.fx.GraphModule) -> GraphRecord:
    subgraphs: dict[str, GraphRecord | str] = {}
    first_name: dict[int, str] = {}
    for name, child in gm._modules.items():
        if not isinstance(child, torch.fx.GraphModule):
            continue  # not a subgraph: a get_attr of it is refused below
        if id(child) in first_name:
            subgraphs[name] = first_name[id(child)]
        else:
            first_name[id(child)] = name
            subgraphs[name] = _record(child)
    index = {node: i for i, node in enumerate(gm.graph.nodes)}
    nodes, constants = [], {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            if node.target not in subgraphs:
                constants[node.target] = _stored_constant(gm, node.target)
        elif node.op not in ("placeholder", "call_function", "output"):
            raise _Unstorable(node.op)
        refer = lambda value: torch.fx.node.map_arg(value, lambda n: _Node(index[n]))  # noqa: E731, B023
        nodes.append(
            (
                node.op,
                node.name,
                _target_of(node),
                refer(node.args),
                refer(node.kwargs),
                _describe(node.meta.get("val")),
            )
        )
    return GraphRecord(nodes, constants, subgraphs)


def _target_of(node: torch.fx.Node):
    target = node.target
    if node.op in ("placeholder", "get_attr", "output"):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return ("op", target.namespace, target._opname, target._overloadname)
    if isinstance(target, torch._ops.HigherOrderOperator):
        from tpu_backend.compile.interpreter import runs_higher_order

        # only the ones we run: their arguments are nodes, subgraphs and plain values
        if not runs_higher_order(target) or getattr(torch.ops.higher_order, target.name(), None) is not target:
            raise _Unstorable(str(target))
        return ("higher_order", target.name())
    if not callable(target):
        raise _Unstorable(str(target))
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise _Unstorable(str(target))
    return ("function", module, qualname)


def _resolve_target(target):
    if not isinstance(target, tuple):
        return target
    if target[0] == "op":
        _, namespace, name, overload = target
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)
    if target[0] == "higher_order":
        return getattr(torch.ops.higher_order, target[1])
    _, module, qualname = target
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _stored_constant(gm: torch.fx.GraphModule, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    if not isinstance(value, torch.Tensor) or isinstance(value, torch._subclasses.FakeTensor):
        raise _Unstorable(target)
    with unset_fake_temporarily():  # AOTAutograd calls the compiler inside its fake mode
        return value.detach().to("cpu").clone(), str(value.device)


def _describe(value):
    """A FakeTensor value (or a structure of them and plain values) as plain data."""
    if isinstance(value, torch.Tensor):
        sizes = (*value.shape, *value.stride(), value.storage_offset())
        if not all(isinstance(d, int) for d in sizes):
            raise _Unstorable("symbolic sizes")
        return (
            "tensor",
            tuple(value.shape),
            tuple(value.stride()),
            value.storage_offset(),
            value.dtype,
            str(value.device),
        )
    if isinstance(value, (list, tuple)):
        return ("sequence", type(value) is list, [_describe(v) for v in value])
    if value is None or type(value) in (bool, int, float):
        return ("value", value)
    raise _Unstorable(type(value).__name__)


def _fake(described):
    """The FakeTensor (or structure) `described` stands for; call inside a FakeTensorMode."""
    kind = described[0]
    if kind == "tensor":
        _, shape, stride, offset, dtype, device = described
        value = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        return value.as_strided(shape, stride, offset) if offset else value
    if kind == "sequence":
        values = [_fake(d) for d in described[2]]
        return values if described[1] else tuple(values)
    return described[1]


def _map_refs(value, made: list):
    if isinstance(value, _Node):
        return made[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(_map_refs(v, made) for v in value)
    if isinstance(value, dict):
        return {k: _map_refs(v, made) for k, v in value.items()}
    return value


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
    from tpu_backend.compile.interpreter import lowering_tables_version

    return f"tpu_backend {program_cache.source_hash()} {lowering_tables_version()} {kernel_mode.mode()}"


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


class _LoadedWhenCalled:
    """A GraphModule's reduction (`fn, args`), pickled as bytes and rebuilt only when called."""

    def __init__(self, fn=None, args: tuple = (), data: bytes | None = None):
        self.reduced = (fn, args) if data is None else None
        self.data = data

    def __reduce__(self):
        data = self.data if self.data is not None else pickle.dumps(self.reduced)
        return (_LoadedWhenCalled, (None, (), data))

    def __call__(self) -> torch.fx.GraphModule:
        fn, args = self.reduced if self.reduced is not None else pickle.loads(self.data)
        return fn(*args)


def _serialize_backward_lazily(gm: torch.fx.GraphModule):
    """AOTAutograd's copy of a backward graph in the entry (`serialized_bw_module`: only
    compiled autograd reads it), rebuilt when read instead of when the entry is loaded.
    PyTorch rebuilds a pickled GraphModule by re-tracing its code (torch.fx's symbolic
    trace), which also runs its subgraphs' argument-free ops: for the scanned Llama, five
    eager device programs and a quarter second in every process that loads the entry."""
    serialized = _aot_result.serialize_graph_module(gm)
    serialized.fn, serialized.args = _LoadedWhenCalled(serialized.fn, serialized.args), ()
    return serialized


def _no_backend_registration() -> None:
    """In place of inductor's `init_backend_registration` while AOTAutograd computes its
    key: PyTorch registers inductor's code generators for every device there (importing
    the C++, Triton, Halide, Pallas, MPS and XPU code generators: 0.7 s per process here)
    only to list the custom passes registered with them, which inductor runs and our
    programs never do. Without it the key lists the custom passes registered so far
    (none, unless inductor ran in the process first: then its key differs, a miss, never
    a wrong hit)."""


def _key_without_backend_id(original):
    """PyTorch's key, computed without `precompile_backend_id`: with Dynamo's caching
    precompile on (`dynamo_cache.py`), AOTAutograd's config carries Dynamo's name for the
    graph, `__compiled_fn_<n>_<uuid>`, new in every process, and torch 2.13 hashes it
    into the key (the same name on the graph module it leaves out, `sanitize_gm_for_cache`):
    no entry would ever hit in another process."""

    @functools.wraps(original)
    def autograd_cache_key(mod, example_inputs, config, *args, **kwargs):
        if getattr(config, "precompile_backend_id", None) is not None:
            config = dataclasses.replace(config, precompile_backend_id=None)
        return original(mod, example_inputs, config, *args, **kwargs)

    return autograd_cache_key


_HOOKS = (
    (_aot_cache, "autograd_cache_key"),
    (_aot_cache.AOTAutogradCache, "_write_to_local_cache"),
    (_aot_cache.AOTAutogradCache, "iterate_over_candidates"),
    (_graph_compile, "serialize_graph_module"),
    (_codecache, "init_backend_registration"),
)


@contextlib.contextmanager
def compiling():
    """The scope of one AOTAutograd call of the backend (see the module docstring)."""
    if not enabled():
        yield
        return
    cls = _aot_cache.AOTAutogradCache
    missing = [name for owner, name in _HOOKS if not hasattr(owner, name)]
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
            (_graph_compile, "serialize_graph_module", _serialize_backward_lazily),
            (_codecache, "init_backend_registration", _no_backend_registration),
            (_aot_cache, "autograd_cache_key", _key_without_backend_id(_aot_cache.autograd_cache_key)),
        ),
    ):
        yield


def counters() -> dict[str, int]:
    """AOTAutograd's cache counters in this process (hit, miss, saved, bypass)."""
    from torch._dynamo.utils import counters as torch_counters

    found = torch_counters["aot_autograd"]
    return {name: found.get(f"autograd_cache_{name}", 0) for name in ("hit", "miss", "saved", "bypass")}


__all__ = ["TpuGraphCode", "compiler", "compiling", "counters", "enabled", "key_tag"]
