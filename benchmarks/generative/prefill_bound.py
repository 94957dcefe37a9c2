"""How fast can a prefill that returns exact last-position logits be, against the anchor's
prefill that returns none?

    python -m benchmarks.generative.prefill_bound --anchor-python /tmp/anchor-venv/bin/python
    python -m benchmarks.generative.prefill_bound --anchor-python ... --anchor-dir /tmp/prefill_anchor --repeats 5

The anchor's (litert-torch 0.10.0 `export_hf`) prefill returns only the caches, so its
last layer's query, attention, output projection and MLP and the LM head are dead code.
A prefill that returns the last position's logits must do that work for one row: the LM
head (vocabulary x width weights) and the last layer's projections, matrix-vector products
that read each weight once and are memory-bound. Per model (generative_bench.py's Llama
and Qwen3 configs, same seeded weights for every file), timed in LiteRT:

- anchor: the anchor's prefill (the reference, 1.00);
- none / last: ours, `export_generative(prefill_logits="none" | "last")`;
- head row, layer row: that extra work alone, as standalone models converted with our
  converter from the model's own modules: the final norm and LM head on one row; the last
  layer from its input norm to its MLP on one row, given the row and that layer's keys and
  values (rotary embedding left out: elementwise on one row);
- skeleton none / last: only the matrix products of the prefill (every projection of every
  layer on all rows; of the last layer only keys and values, plus with "last" its query,
  output and MLP projections and the LM head on the last row), chained by additions and
  one product: the prefill's time if everything else (norms, rotary embedding, attention
  over the cache, the cache writes) were free.

The bound: the "none" ratio plus the head and layer rows' ratios (the standalone models
hold their weights warm in cache between invokes, so this underestimates what the work
costs inside a prefill; "last - none" is the same work measured in place). If the bound
exceeds 1.0, a "last" prefill cannot match the anchor's with these kernels.

Method: CPU time of this thread around each `Invoke` (1 thread, XNNPACK: LiteRT runs the
whole model in the calling thread, so time descheduled by other processes is not counted);
all programs of a model are timed in the same rounds, their order reversed every other
round; each of --blocks blocks creates fresh interpreters, in the listed order in even
blocks and reversed in odd ones (where an interpreter lands in memory biases its time);
a block's ratio is the median time of a program over the anchor's, a repeat's the
geometric mean over its blocks. The table shows the median over --repeats, and their
range in parentheses. Without --anchor-python, our "none" file stands in for the anchor's.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch import nn

import litert_torch
from benchmarks import harness
from benchmarks.generative.generative_bench import MODELS, SIZE, export_anchor
from benchmarks.harness import interleaved, write_json
from litert_torch.generative import export_generative
from litert_torch.generative.kv_cache import attention_bias
from runtimes.litert import LiteRTModel, max_relative_error

# Table columns: the programs timed, then the figures derived from them (ratios to the anchor).
PROGRAMS = ["anchor", "none", "last", "head row", "layer row", "skeleton none", "skeleton last"]
DERIVED = ["last - none", "bound"]


class HeadRow(nn.Module):
    """The final norm and LM head on one row."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.norm, self.lm_head = lm.model.norm, lm.lm_head

    def forward(self, x):
        return self.lm_head(self.norm(x))


class LayerRow(nn.Module):
    """The last decoder layer on one row `x` (1, 1, width), given the layer's keys and values
    (1, kv heads, P, head dim), which a prefill computes for the cache in any case."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.layer = lm.model.layers[-1]
        self.heads = lm.config.num_attention_heads

    def forward(self, x, k, v):
        attn = self.layer.self_attn
        q = attn.q_proj(self.layer.input_layernorm(x)).view(1, 1, self.heads, -1)
        if hasattr(attn, "q_norm"):  # Qwen3
            q = attn.q_norm(q)
        groups = self.heads // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(1, 1, -1))
        return x + self.layer.mlp(self.layer.post_attention_layernorm(x))


class MatmulSkeleton(nn.Module):
    """Only the prefill's matrix products, with the model's weights, on embeddings (1, P,
    width); each product's input depends on the previous one so that none is folded away."""

    def __init__(self, lm: nn.Module, last: bool):
        super().__init__()
        self.layers, self.lm_head, self.last = lm.model.layers, lm.lm_head, last

    @staticmethod
    def block(layer, x):
        attn, mlp = layer.self_attn, layer.mlp
        x = x + attn.o_proj(attn.q_proj(x))
        return x + mlp.down_proj(mlp.gate_proj(x) * mlp.up_proj(x))

    def forward(self, x):
        kv = []
        for i, layer in enumerate(self.layers):
            kv += [layer.self_attn.k_proj(x), layer.self_attn.v_proj(x)]
            if i < len(self.layers) - 1:
                x = self.block(layer, x)
        if not self.last:
            return tuple(kv)
        return (self.lm_head(self.block(self.layers[-1], x[:, -1:])), *kv)


class Timed:
    """One signature of a .tflite file in a fresh 1-thread XNNPACK interpreter, its inputs
    set once; `invoke` runs it again on them."""

    def __init__(self, content: bytes, key: str | None, inputs: dict):
        model = LiteRTModel(content, num_threads=1)
        sig = model.signature(key)
        self.outputs = dict(zip(sig.output_names, model.run([inputs[t.name] for t in sig.inputs], sig.key)))
        runner = model._runner(sig.key)  # timing the bare Invoke: no input or output copies
        self.invoke = functools.partial(runner._interpreter_wrapper.Invoke, runner._subgraph_index)
        self._model = model


def prefill_inputs(content: bytes, key: str, ids: np.ndarray, cache_len: int) -> dict:
    """Inputs of a prefill signature by name: tokens, input_pos, the anchor's additive mask;
    anything else (the caches) zeros."""
    positions = np.arange(ids.shape[1], dtype=np.int32)
    values = {
        "tokens": ids,
        "input_pos": positions,
        "mask": attention_bias(torch.from_numpy(positions), cache_len).numpy()[None, None],
    }
    sig = LiteRTModel(content, num_threads=1).signature(key)
    return {t.name: values.get(t.name, np.zeros(t.shape, t.dtype)) for t in sig.inputs}


def standalone(module: nn.Module, *args: torch.Tensor) -> tuple[bytes, None, dict]:
    """`module` converted with our converter, and its one signature's inputs by name."""
    content = litert_torch.convert(module, args, progress=False).model_content()
    names = LiteRTModel(content, num_threads=1).signature().input_names
    return content, None, dict(zip(names, (a.numpy() for a in args)))


def programs(model: nn.Module, prefill_len: int, cache_len: int, anchor: bytes | None) -> tuple[dict, float]:
    """The timed programs of PROGRAMS as (content, signature key, inputs by name), and the
    max relative error of our "last" logits against PyTorch's at the prompt's last position."""
    ids = torch.randint(0, model.config.vocab_size, (1, prefill_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    tokens = ids.int().numpy()
    files = {
        logits: export_generative(
            # (verify=False: the "last" logits are checked against PyTorch's below)
            model,
            prefill_len=prefill_len,
            cache_len=cache_len,
            prefill_logits=logits,
            verify=False,
            progress=False,
        ).model_content()
        for logits in ("none", "last")
    }
    anchor_key = f"prefill_{prefill_len}" if anchor else "prefill"
    anchor = anchor or files["none"]
    found = {
        name: (content, "prefill", prefill_inputs(content, "prefill", tokens, cache_len))
        for name, content in files.items()
    }
    last = Timed(*found["last"]).outputs["logits"]
    error = max_relative_error(last, out.logits[:, -1:].numpy())
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    gen = torch.Generator().manual_seed(2)
    row = out.hidden_states[-2][:, -1:]  # the last layer's input at the last position
    k, v = (torch.randn(1, cfg.num_key_value_heads, prefill_len, head_dim, generator=gen) for _ in range(2))
    with torch.no_grad():
        found.update(
            {
                "anchor": (anchor, anchor_key, prefill_inputs(anchor, anchor_key, tokens, cache_len)),
                "head row": standalone(HeadRow(model).eval(), row),
                "layer row": standalone(LayerRow(model).eval(), row, k, v),
                "skeleton none": standalone(MatmulSkeleton(model, last=False).eval(), out.hidden_states[0]),
                "skeleton last": standalone(MatmulSkeleton(model, last=True).eval(), out.hidden_states[0]),
            }
        )
    return {name: found[name] for name in PROGRAMS}, error


def block_times(found: dict, order: list[str], rounds: int, warmup: int) -> dict[str, float]:
    """Median thread-CPU seconds per invoke of each program, fresh interpreters created in
    `order`, the invokes of a round in `order`, reversed every other round."""
    timed = {name: Timed(*found[name]) for name in order}
    samples = interleaved([timed[name].invoke for name in order], rounds, time.thread_time, warmup)
    return {name: statistics.median(s) / 1e3 for name, s in zip(order, samples)}


def measure(found: dict, blocks: int, rounds: int, warmup: int = 3) -> dict:
    """One repeat: per program, the geometric mean over blocks of its ratio to the anchor,
    and the anchor's milliseconds (median over blocks); plus DERIVED."""
    ratios: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    anchor_s = []
    for block in range(blocks):
        times = block_times(found, PROGRAMS if block % 2 == 0 else PROGRAMS[::-1], rounds, warmup)
        anchor_s.append(times["anchor"])
        for name in PROGRAMS:
            ratios[name].append(times[name] / times["anchor"])
    row = {name: math.exp(statistics.fmean(map(math.log, r))) for name, r in ratios.items()}
    row["last - none"] = row["last"] - row["none"]
    row["bound"] = row["none"] + row["head row"] + row["layer row"]
    row["anchor ms"] = 1e3 * statistics.median(anchor_s)
    return row


def summarize(name: str, repeats: list[dict], error: float) -> dict:
    """Median and range over the repeats of every figure."""
    keys = ["anchor ms", *PROGRAMS[1:], *DERIVED]
    return {
        "model": name,
        "last_rel_err": error,
        "repeats": repeats,
        **{k: statistics.median(r[k] for r in repeats) for k in keys},
        "range": {k: (min(r[k] for r in repeats), max(r[k] for r in repeats)) for k in keys},
        "load": os.getloadavg()[0],
    }


def table(rows: list[dict], title: str) -> Table:
    columns = ["anchor ms", *PROGRAMS[1:], *DERIVED]
    out = harness.table(title, ["model", *columns, "last err", "load"])
    for r in rows:
        cells = [f"{r[c]:.2f} ({r['range'][c][0]:.2f}-{r['range'][c][1]:.2f})" for c in columns]
        out.add_row(r["model"], *cells, f"{r['last_rel_err']:.1e}", f"{r['load']:.1f}")
    return out


def anchor_file(model: nn.Module, name: str, opts) -> bytes:
    """The anchor's export of `model`, kept in --anchor-dir if given (the weights are seeded,
    so a kept file stays valid for the same name, SIZE and lengths)."""
    path = opts.anchor_dir / f"{name}_p{opts.prefill_len}_c{opts.cache_len}.anchor.tflite" if opts.anchor_dir else None
    if path and path.exists():
        return path.read_bytes()
    report = export_anchor(model, types.SimpleNamespace(**vars(opts)))
    if "error" in report:
        raise SystemExit(f"the anchor's export of {name} failed: {report['error']}")
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(report["content"])
    return report["content"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="hf_llama,hf_qwen3", help="comma-separated, of generative_bench's HF models"
    )
    parser.add_argument("--prefill-len", type=int, default=32)
    parser.add_argument("--cache-len", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=4, help="fresh interpreter sets per repeat (even)")
    parser.add_argument("--rounds", type=int, default=100, help="timed invokes of each program per block")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--anchor-python", default=None, help="python of the litert-torch 0.10.0 environment")
    parser.add_argument("--anchor-dir", type=Path, default=None, help="keep and reuse the anchor's files here")
    parser.add_argument("--json", type=Path, default=None)
    opts = parser.parse_args(argv)
    if opts.blocks % 2:
        parser.error("--blocks must be even (half create the interpreters in reverse order)")
    warnings.filterwarnings("ignore")
    console = Console(width=240)
    rows = []
    for name in opts.models.split(","):
        console.print(f"[dim]{name}...[/dim]")
        torch.manual_seed(0)
        model = MODELS[name]().eval()
        anchor = anchor_file(model, name, opts) if opts.anchor_python else None
        found, error = programs(model, opts.prefill_len, opts.cache_len, anchor)
        repeats = [measure(found, opts.blocks, opts.rounds) for _ in range(opts.repeats)]
        rows.append(summarize(name, repeats, error))
    reference = "the anchor's prefill" if opts.anchor_python else 'our "none" prefill (no --anchor-python)'
    console.print(
        table(
            rows,
            f"Prefill ({opts.prefill_len} tokens, cache {opts.cache_len}): thread CPU time per invoke / {reference}; "
            f"median (range) over {opts.repeats} repeats of {opts.blocks} blocks x {opts.rounds} rounds; "
            "bound = none + head row + layer row",
        )
    )
    if opts.json:
        settings = {**vars(opts), "json": str(opts.json), "anchor_dir": str(opts.anchor_dir)}
        write_json(opts.json, dict(settings=settings, size=SIZE, results=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
