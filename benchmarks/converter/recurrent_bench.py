"""LSTM / GRU in LiteRT: which lowering runs fastest?

For each configuration, the same nn.LSTM / nn.GRU (seeded random weights) becomes:

| variant | what it is |
| --- | --- |
| unrolled | `converter/lowering/recurrent.py`'s unrolled form: one FULLY_CONNECTED projects the whole input sequence, then per step one recurrent FULLY_CONNECTED and the gate math |
| builtin | (LSTM) recurrent.py's fused form: UNIDIRECTIONAL_SEQUENCE_LSTM per layer and direction, its state variables rewritten from the initial states on every call |
| decomposed | PyTorch's own decomposition of `aten.lstm`/`aten.gru` (per-step matmuls), lowered op by op: what the converter does without recurrent.py |
| builtin, raw states | (LSTM, one layer, one direction) the bare UNIDIRECTIONAL_SEQUENCE_LSTM, built here, without the state refresh |

Per variant: median invoke latency (1-thread XNNPACK interpreter, runs interleaved), op
count, file size, max relative error vs PyTorch on the first call and on a SECOND call with
the same input: the bare builtin keeps its states in variable tensors that carry over
between invocations, so it reproduces a stateless nn.LSTM only on the first call.

    python -m benchmarks.converter.recurrent_bench [--runs 50] [--json out.json]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks import harness
from benchmarks.converter.litert_measure import LoadedModel, max_relative_error, median_latencies, op_histogram
from benchmarks.harness import write_json
from converter import ir
from converter.lowering import decompositions, recurrent
from converter.passes import optimize
from converter.pipeline import export_module, lower_program
from converter.writer import write_flatbuffer

aten = torch.ops.aten

CONFIGS = [  # (kind, batch, steps, input, hidden, layers, bidirectional)
    ("LSTM", 1, 32, 64, 128, 1, False),
    ("LSTM", 8, 16, 64, 128, 1, False),
    ("LSTM", 1, 50, 40, 256, 1, False),
    ("LSTM", 4, 20, 32, 64, 2, True),
    ("GRU", 1, 32, 64, 128, 1, False),
    ("GRU", 8, 16, 64, 128, 2, True),
]


class _SequenceOutput(torch.nn.Module):
    """The recurrent layer's output sequence only (what the builtin returns)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


def _convert(module, x, lowering: str) -> bytes:
    """Convert with recurrent.py forced to `lowering` ("unrolled" or "builtin"), or with
    PyTorch's own decomposition of the recurrent op ("decomposed")."""
    program = export_module(_SequenceOutput(module), (x,))
    table = decompositions.decomposition_table()
    if lowering == "decomposed":
        defaults = torch.export.default_decompositions()
        for op in (aten.lstm.input, aten.gru.input):
            table[op] = defaults[op]
    chosen = recurrent._use_builtin
    recurrent._use_builtin = lambda sh, weights: lowering == "builtin"
    try:
        graph = lower_program(program.run_decompositions(table))
    finally:
        recurrent._use_builtin = chosen
    return write_flatbuffer(optimize(ir.Model([graph])))


def _builtin_lstm(module: torch.nn.LSTM, x: torch.Tensor) -> bytes:
    """One UNIDIRECTIONAL_SEQUENCE_LSTM (batch-major) with module's weights; outputs the sequence."""
    batch, steps, features = x.shape
    hidden = module.hidden_size
    w_ih, w_hh = module.weight_ih_l0.detach().numpy(), module.weight_hh_l0.detach().numpy()
    bias = (module.bias_ih_l0 + module.bias_hh_l0).detach().numpy()

    def const(name, value):
        value = np.ascontiguousarray(value, dtype=np.float32)
        return ir.Tensor(name, value.shape, np.float32, data=value)

    gates = "ifco"  # TFLite's names; PyTorch's rows are i, f, g (= c), o in the same order
    inputs = [ir.Tensor("x", x.shape, np.float32, shape_signature=(-1, -1, x.shape[2]))]
    inputs += [const(f"w_i{g}", w_ih[k * hidden : (k + 1) * hidden]) for k, g in enumerate(gates)]
    inputs += [const(f"w_h{g}", w_hh[k * hidden : (k + 1) * hidden]) for k, g in enumerate(gates)]
    inputs += [None, None, None]  # no peepholes
    inputs += [const(f"b_{g}", bias[k * hidden : (k + 1) * hidden]) for k, g in enumerate(gates)]
    inputs += [None, None]  # no projection
    inputs += [ir.Tensor(name, (batch, hidden), np.float32, is_variable=True) for name in ("h", "c")]
    inputs += [None] * 4  # no layer norm
    y = ir.Tensor("y", (batch, steps, hidden), np.float32)
    op = ir.Op(
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        inputs,
        [y],
        {
            "fusedActivationFunction": "TANH",
            "cellClip": 0.0,
            "projClip": 0.0,
            "timeMajor": False,
            "asymmetricQuantizeInputs": False,
            "diagonalRecurrentTensors": False,
        },
    )
    graph = ir.Graph(inputs=[inputs[0]], outputs=[y], ops=[op], input_names=["x"], output_names=["output_0"])
    return write_flatbuffer(ir.Model([graph]))


def _measure(config, runs: int) -> list[dict]:
    kind, batch, steps, features, hidden, layers, bidirectional = config
    torch.manual_seed(0)
    module = getattr(torch.nn, kind)(
        features, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=True
    ).eval()
    x = torch.randn(batch, steps, features)
    with torch.no_grad():
        expected = module(x)[0].numpy()
    variants = {"unrolled": _convert(module, x, "unrolled"), "decomposed": _convert(module, x, "decomposed")}
    if kind == "LSTM":
        variants["builtin"] = _convert(module, x, "builtin")
    if kind == "LSTM" and layers == 1 and not bidirectional:
        variants["builtin, raw states"] = _builtin_lstm(module, x)
    loaded = {name: LoadedModel(content) for name, content in variants.items()}
    errors = {}
    for name, model in loaded.items():
        first = model.run([x.numpy()])[0]
        second = model.run([x.numpy()])[0]
        errors[name] = (max_relative_error([first], [expected]), max_relative_error([second], [expected]))
    latencies = median_latencies(list(loaded.values()), [x.numpy()], runs=runs)
    rows = []
    label = f"{kind} b{batch} t{steps} in{features} h{hidden} l{layers}{' bi' if bidirectional else ''}"
    for (name, content), latency in zip(variants.items(), latencies):
        rows.append(
            {
                "config": label,
                "variant": name,
                "latency_ms": latency * 1e3,
                "ops": sum(op_histogram(content).values()),
                "kib": len(content) / 1024,
                "err_first_call": errors[name][0],
                "err_second_call": errors[name][1],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    from rich.console import Console

    rows = [row for config in CONFIGS for row in _measure(config, args.runs)]
    columns = ("config", "variant", "latency ms", "vs unrolled", "ops", "KiB", "err 1st call", "err 2nd call")
    table = harness.table("LSTM / GRU in LiteRT (XNNPACK, 1 thread, median ms)", columns, labels=2)
    base = {r["config"]: r["latency_ms"] for r in rows if r["variant"] == "unrolled"}
    for r in rows:
        table.add_row(
            r["config"],
            r["variant"],
            f"{r['latency_ms']:.3f}",
            f"{r['latency_ms'] / base[r['config']]:.2f}x",
            str(r["ops"]),
            f"{r['kib']:.0f}",
            f"{r['err_first_call']:.1e}",
            f"{r['err_second_call']:.1e}",
        )
    Console(width=max(Console().width, 132)).print(table)
    if args.json:
        payload = {"runs": args.runs, "torch": torch.__version__, "rows": rows}
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
