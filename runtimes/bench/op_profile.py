"""Per-op host timings: each op of a model run alone, as a one-op model."""

from __future__ import annotations

import time

import numpy as np

from runtimes.bench.model_file import read_model_file


def _single_op_model(schema, model_t, sg, op) -> bytes:
    """A model holding only `op` of subgraph `sg`: its computed inputs become the graph's
    inputs, its constants keep their data."""
    import copy

    import flatbuffers

    new = schema.ModelT()
    new.version, new.operatorCodes = model_t.version, model_t.operatorCodes
    new.buffers = [schema.BufferT()]
    tensors, index = [], {}

    def take(k):
        if k < 0:
            return -1
        if k not in index:
            t = copy.copy(sg.tensors[k])
            data = model_t.buffers[t.buffer].data if t.buffer < len(model_t.buffers) else None
            if data is not None and len(data):
                new.buffers.append(model_t.buffers[t.buffer])
                t.buffer = len(new.buffers) - 1
            else:
                t.buffer = 0
            index[k] = len(tensors)
            tensors.append(t)
            q = t.quantization
            if q is not None and q.detailsType == schema.QuantizationDetails.BlockwiseQuantization:
                # Blockwise (int4) scales are tensors named by index: bring them along, renumbered
                # (the original indices point past this model's tensors: LiteRT would crash).
                details = copy.copy(q.details)
                details.scales, details.zeroPoints = take(details.scales), take(details.zeroPoints)
                t.quantization = copy.copy(q)
                t.quantization.details = details
        return index[k]

    one = copy.copy(op)
    one.inputs = [take(int(k)) for k in (op.inputs if op.inputs is not None else [])]
    one.outputs = [take(int(k)) for k in op.outputs]
    one.intermediates = [take(int(k)) for k in op.intermediates] if op.intermediates is not None else None
    graph = schema.SubGraphT()
    graph.tensors, graph.operators = tensors, [one]
    graph.inputs = [k for k in one.inputs if k >= 0 and tensors[k].buffer == 0 and not tensors[k].isVariable]
    graph.outputs = list(one.outputs)
    new.subgraphs = [graph]
    builder = flatbuffers.Builder(1024)
    builder.Finish(new.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _time_alone(content: bytes, runs: int, threads: int | None, use_xnnpack: bool) -> float:
    """Median microseconds of one invoke of a single-op model (zeros for integer inputs, so
    indices stay in range; normal floats otherwise)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from runtimes.litert import without_xnnpack_notice

    kwargs = {} if use_xnnpack else {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    with without_xnnpack_notice():
        interpreter = Interpreter(model_content=content, num_threads=threads, **kwargs)
        interpreter.allocate_tensors()
    rng = np.random.default_rng(0)
    for d in interpreter.get_input_details():
        dtype = np.dtype(d["dtype"])
        value = rng.standard_normal(d["shape"]).astype(dtype) if dtype.kind == "f" else np.zeros(d["shape"], dtype)
        interpreter.set_tensor(d["index"], value)
    interpreter.invoke()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        interpreter.invoke()
        times.append((time.perf_counter() - start) * 1e6)
    return float(np.median(times))


def op_profile(
    model, *, runs: int = 20, threads: int | None = None, use_xnnpack: bool = True, subgraph: int = 0
) -> list[dict]:
    """Per-op host timings: each op of `subgraph` runs alone, as a one-op model, in the
    LiteRT interpreter (ai-edge-litert has no op profiler in Python). Sums differ from the
    whole model's time (no fusion or cache reuse across ops); use it to find hot ops.
    Rows: index, op, median_us, percent (of the sum), or error."""
    from ai_edge_litert import schema_py_generated as schema

    from common.tflite_schema import CONTROL_FLOW, opcode_name

    content, _ = read_model_file(model)
    model_t = schema.ModelT.InitFromPackedBuf(content, 0)
    sg = model_t.subgraphs[subgraph]
    rows = []
    for i, op in enumerate(sg.operators):
        code = model_t.operatorCodes[op.opcodeIndex]
        name = opcode_name(code.builtinCode, code.deprecatedBuiltinCode)
        row = {"index": i, "op": name}
        try:
            if name in CONTROL_FLOW:
                raise ValueError("control flow calls other subgraphs")
            row["median_us"] = _time_alone(_single_op_model(schema, model_t, sg, op), runs, threads, use_xnnpack)
        except (ValueError, RuntimeError) as e:
            row["error"] = str(e).splitlines()[0][:120]
        rows.append(row)
    total = sum(r.get("median_us", 0.0) for r in rows) or 1.0
    for r in rows:
        if "median_us" in r:
            r["percent"] = 100.0 * r["median_us"] / total
    return rows


def op_profile_by_type(rows: list[dict]) -> list[dict]:
    """The per-op rows summed by op type, largest first (like benchmark_model's summary)."""
    by: dict[str, dict] = {}
    for r in rows:
        entry = by.setdefault(r["op"], {"op": r["op"], "count": 0, "total_us": 0.0, "percent": 0.0})
        entry["count"] += 1
        entry["total_us"] += r.get("median_us", 0.0)
        entry["percent"] += r.get("percent", 0.0)
    return sorted(by.values(), key=lambda e: -e["total_us"])
