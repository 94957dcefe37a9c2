"""TorchTPU (torch-tpu 0.2.0) beside this project's "tpu" device, on the same chip, back to back.

Each side runs in a process of its own (both name their device "tpu" and their compile backend
"tpu"; TorchTPU loads itself into every `import torch` that can see it, so it is on the path of
its own processes only: `TORCH_TPU_SITE`, where `tools/torch_tpu/env.sh` installs it). A row is
one workload in one mode on both sides:

| row | workload | ours | TorchTPU |
| --- | --- | --- | --- |
| `mingpt-strict` | minGPT (6 x 384, context 128), batch 32, AdamW | strict eager | `EagerMode.DEFER_NEVER` |
| `mingpt-fused` | the same | fused eager | `EagerMode.DEFER_AND_FUSE` |
| `mingpt-compile` | the same | `torch.compile(model, backend="tpu")` | the same call |
| `llama-374m-compile` | versus_jax's Llama 374M, bf16, batch 4 x 2048, full remat, AdamW | `torch.compile` | the same |
| `errors` | the same bad inputs on both (and on CPU): the error each gives, or "no error" | | |
| `ops` | PyTorch's OpInfo samples (float32, the first of each op) against CPU: ok / differs / error | | |

A training row reports the first step (tracing and compiling included), the median step after
`--warmup` (each step synchronised by `loss.item()`, the same on both sides) and the first
losses (the same seed and batch: they should agree to bf16/f32 rounding).

    python -m benchmarks.anchors.torch_tpu_vs_ours                          # every row, both sides
    python -m benchmarks.anchors.torch_tpu_vs_ours --rows mingpt-fused,errors --sides ours
    python -m benchmarks.anchors.torch_tpu_vs_ours --tiny --steps 3         # small models (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

SIDES = ("ours", "torch_tpu")
RESULT = "RESULT "  # a child's last line: RESULT <json>


@dataclass(frozen=True)
class Row:
    workload: str  # "mingpt", "llama-374m", or a special row ("errors", "ops")
    batch: int = 0
    ours: str = ""  # our eager mode ("strict", "fused") or "compile"
    theirs: str = ""  # TorchTPU's EagerMode member name, or "compile"
    remat: str | None = None


ROWS = {
    "mingpt-strict": Row("mingpt", 32, "strict", "DEFER_NEVER"),
    "mingpt-fused": Row("mingpt", 32, "fused", "DEFER_AND_FUSE"),
    "mingpt-compile": Row("mingpt", 32, "compile", "compile"),
    "llama-374m-compile": Row("llama-374m", 4, "compile", "compile", remat="full"),
    "errors": Row("errors"),
    "ops": Row("ops"),
}


# --------------------------------------------------------------------------- a child: one side


def _device_side(side: str, mode: str):
    """Set the side's eager mode; returns its synchronize."""
    import torch

    if side == "torch_tpu":
        if not hasattr(torch, "tpu") or not hasattr(torch.tpu, "EagerMode"):
            raise RuntimeError("TorchTPU did not load: torch_tpu is not on this process's path (TORCH_TPU_SITE)")
        if torch.accelerator.device_count() == 0:
            raise RuntimeError("TorchTPU loaded but found no TPU (torch.accelerator.device_count() == 0)")
        if mode != "compile":
            torch.tpu.eager_mode = getattr(torch.tpu.EagerMode, mode)
        return torch.tpu.synchronize
    import tpu_backend

    tpu_backend.set_eager_mode("strict" if mode == "compile" else mode)
    return torch.tpu.synchronize


def _workload(row: Row, tiny: bool):
    """(model on CPU, loss, batch) of a training row, the same on both sides."""
    import dataclasses

    import torch

    from benchmarks.models import LLAMA_374M, MINGPT, LlamaLM, TinyGPT, sequence_loss

    torch.manual_seed(0)
    if row.workload == "mingpt":
        config = dataclasses.replace(MINGPT, width=64, heads=2, layers=2, context=32) if tiny else MINGPT
        model = TinyGPT(config)
    else:
        config = dataclasses.replace(LLAMA_374M, checkpoint=row.remat)
        if tiny:
            config = dataclasses.replace(config, vocab=512, context=64, width=64, heads=2, layers=2, ffn=128)
        model = LlamaLM(config)
    tokens = torch.randint(0, config.vocab, (2 if tiny else row.batch, config.context + 1))
    return model, sequence_loss, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def train_row(side: str, row: Row, steps: int, warmup: int, tiny: bool) -> dict:
    import torch

    synchronize = _device_side(side, row.theirs if side == "torch_tpu" else row.ours)
    model, loss_fn, (x, y) = _workload(row, tiny)
    model = model.to("tpu")
    x, y = x.to("tpu"), y.to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = torch.compile(model, backend="tpu") if "compile" in (row.ours, row.theirs) else model
    times, losses = [], []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        loss = loss_fn(run(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # the step's end, on both sides
        times.append(time.perf_counter() - start)
    synchronize()
    return {
        "first_step_s": times[0],
        "step_ms": 1e3 * statistics.median(times[warmup:]),
        "losses": losses[:3],
    }


def _bad_inputs():
    """(name, call on a device): inputs PyTorch refuses on CPU."""
    import torch
    import torch.nn.functional as F

    return {
        "matmul of (2, 3) and (4, 5)": lambda d: torch.ones(2, 3, device=d) @ torch.ones(4, 5, device=d),
        "index 5 of 3 elements": lambda d: torch.ones(3, device=d)[torch.tensor([5], device=d)].cpu(),
        "embedding id 10 of a 4-row table": lambda d: F.embedding(
            torch.tensor([10], device=d), torch.ones(4, 2, device=d)
        ).cpu(),
        "view of 6 elements as 4": lambda d: torch.ones(6, device=d).view(4),
        "cross_entropy target 5 of 3 classes": lambda d: F.cross_entropy(
            torch.zeros(2, 3, device=d), torch.tensor([0, 5], device=d)
        ).item(),
        "matmul of float32 and int64": lambda d: (
            torch.ones(2, 2, device=d) @ torch.ones(2, 2, dtype=torch.int64, device=d)
        ),
    }


def errors_row(side: str) -> dict:
    _device_side(side, "strict" if side == "ours" else "DEFER_NEVER")
    out = {}
    for name, call in _bad_inputs().items():
        for device in ("cpu", "tpu"):
            key = f"{name} [{device}]"
            try:
                result = call(device)
                out[key] = f"no error (returned {result.tolist() if hasattr(result, 'tolist') else result})"
            except Exception as e:  # noqa: BLE001  (the message is the measurement)
                out[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return out


def ops_row(side: str, limit: int | None) -> dict:
    """Each OpInfo op's first float32 sample on the device against CPU."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    _device_side(side, "strict" if side == "ours" else "DEFER_NEVER")
    status = {}
    for op in op_db[:limit]:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        try:
            sample = next(iter(op.sample_inputs("cpu", torch.float32)))
            expected = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001  (no CPU reference: not a comparison)
            continue
        moved = sample.transform(lambda t: t.to("tpu") if isinstance(t, torch.Tensor) else t)
        name = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
        try:
            got = op(moved.input, *moved.args, **moved.kwargs)
            got = torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got)
            torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3, equal_nan=True, check_device=False)
            status[name] = "ok"
        except AssertionError:
            status[name] = "differs"
        except Exception as e:  # noqa: BLE001
            status[name] = f"error: {type(e).__name__}"
    return status


def child(side: str, row_name: str, steps: int, warmup: int, tiny: bool, ops_limit: int | None) -> None:
    row = ROWS[row_name]
    if row.workload == "errors":
        result = errors_row(side)
    elif row.workload == "ops":
        result = ops_row(side, ops_limit)
    else:
        result = train_row(side, row, steps, warmup, tiny)
    print(RESULT + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- the parent


def side_env(side: str) -> dict | str:
    """The environment of a side's process, or why that side cannot run here."""
    env = dict(os.environ)
    site = os.environ.get("TORCH_TPU_SITE")
    if side == "torch_tpu":
        if not site or not os.path.isdir(os.path.join(site, "torch_tpu")):
            return "not staged: set TORCH_TPU_SITE (source .tpu-wheels/ts/env.sh after tools/torch_tpu/prepare.sh)"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
        tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"  # TorchTPU asks for it (host speed)
        if os.path.exists(tcmalloc):
            env["LD_PRELOAD"] = tcmalloc
    elif site:  # ours never sees TorchTPU (it would load itself into our `import torch`)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != site]
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_side(side: str, row_name: str, args) -> dict | str:
    env = side_env(side)
    if isinstance(env, str):
        return env
    command = [sys.executable, "-m", "benchmarks.anchors.torch_tpu_vs_ours", "--child", side, "--rows", row_name]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    command += ["--tiny"] * args.tiny + (["--ops-limit", str(args.ops_limit)] if args.ops_limit else [])
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {args.timeout:.0f} s"
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
        with open(os.path.join(args.logs, f"{row_name}.{side}.log"), "w") as f:
            f.write(done.stdout + done.stderr)
    results = [line[len(RESULT) :] for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not results:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"failed (exit {done.returncode}): {last[:300]}"
    return json.loads(results[-1])


def _cell(result, key: str, fmt: str) -> str:
    return fmt.format(result[key]) if isinstance(result, dict) else "-"


def train_table(results: dict) -> list[str]:
    lines = [
        "| row | ours first step s | TorchTPU first step s | ours ms/step | TorchTPU ms/step | ours / TorchTPU speed | first losses (ours; TorchTPU) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, sides in results.items():
        ours, theirs = sides.get("ours"), sides.get("torch_tpu")
        both = isinstance(ours, dict) and isinstance(theirs, dict)
        ratio = f"{theirs['step_ms'] / ours['step_ms']:.3f}" if both else "-"
        losses = "; ".join(
            ", ".join(f"{v:.4f}" for v in r["losses"]) if isinstance(r, dict) else str(r or "-")[:120]
            for r in (ours, theirs)
        )
        lines.append(
            f"| {name} | {_cell(ours, 'first_step_s', '{:.2f}')} | {_cell(theirs, 'first_step_s', '{:.2f}')} | "
            f"{_cell(ours, 'step_ms', '{:.1f}')} | {_cell(theirs, 'step_ms', '{:.1f}')} | {ratio} | {losses} |"
        )
    return lines


def errors_table(sides: dict) -> list[str]:
    lines = ["| bad input | PyTorch on CPU | ours | TorchTPU |", "| --- | --- | --- | --- |"]
    ours, theirs = sides.get("ours"), sides.get("torch_tpu")
    reference = ours if isinstance(ours, dict) else theirs
    if not isinstance(reference, dict):
        return [f"errors: ours {ours}; TorchTPU {theirs}"]
    for key in reference:
        if key.endswith("[cpu]"):
            name = key[: -len(" [cpu]")]
            cells = [r.get(f"{name} [tpu]", "-") if isinstance(r, dict) else str(r) for r in (ours, theirs)]
            lines.append(f"| {name} | {reference[key]} | {cells[0]} | {cells[1]} |")
    return lines


def ops_lines(sides: dict) -> list[str]:
    ours, theirs = sides.get("ours"), sides.get("torch_tpu")
    if not isinstance(ours, dict) or not isinstance(theirs, dict):
        counts = {s: (sum(v == "ok" for v in r.values()) if isinstance(r, dict) else r) for s, r in sides.items()}
        return [f"ops: ok per side {counts}"]
    ok = {side: {op for op, status in r.items() if status == "ok"} for side, r in sides.items()}
    only_theirs, only_ours = sorted(ok["torch_tpu"] - ok["ours"]), sorted(ok["ours"] - ok["torch_tpu"])
    return [
        f"ops: {len(ours)} OpInfo ops run; ok: ours {len(ok['ours'])}, TorchTPU {len(ok['torch_tpu'])}",
        f"ok on TorchTPU, not ours ({len(only_theirs)}): {', '.join(f'{o} ({ours.get(o)})' for o in only_theirs)}",
        f"ok on ours, not TorchTPU ({len(only_ours)}): {', '.join(f'{o} ({theirs.get(o)})' for o in only_ours)}",
    ]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from: {', '.join(ROWS)}")
    parser.add_argument("--sides", default=",".join(SIDES), help="ours, torch_tpu or both (back to back per row)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per training row")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the timed ones (the first included)")
    parser.add_argument("--tiny", action="store_true", help="small models: a smoke run of the harness")
    parser.add_argument("--ops-limit", type=int, default=None, help="the ops row: only the first N OpInfo entries")
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds per side and row")
    parser.add_argument("--logs", default=os.environ.get("OUT"), help="folder for each process's output")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = args.rows.split(",")
    unknown = [r for r in rows if r not in ROWS] + [s for s in args.sides.split(",") if s not in SIDES]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}: rows from {', '.join(ROWS)}; sides from {', '.join(SIDES)}")
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1 (the first step is a warm-up)")
    if args.child:
        child(args.child, rows[0], args.steps, args.warmup, args.tiny, args.ops_limit)
        return {}
    results = {}
    for row_name in rows:
        results[row_name] = {side: run_side(side, row_name, args) for side in args.sides.split(",")}
        print(
            f"{row_name}: "
            + "; ".join(f"{s} {'done' if isinstance(r, dict) else r}" for s, r in results[row_name].items()),
            file=sys.stderr,
            flush=True,
        )
    training = {n: r for n, r in results.items() if ROWS[n].workload not in ("errors", "ops")}
    if training:
        print("\n".join(train_table(training)))
    if "errors" in results:
        print("\n" + "\n".join(errors_table(results["errors"])))
    if "ops" in results:
        print("\n" + "\n".join(ops_lines(results["ops"])))
    return results


if __name__ == "__main__":
    main()
