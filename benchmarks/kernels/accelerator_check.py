"""One command for a CUDA GPU machine: kernels, attention speed and a Llama training step.

    python -m benchmarks.kernels.accelerator_check --json accel.json   # <= 8 minutes on the GPU
    python -m benchmarks.kernels.accelerator_check --smoke --json -    # tiny shapes, CPU, seconds

Written for a machine with torch (CUDA), jax[cuda] (the "tpu" device then runs on JAX's
GPU backend), transformers and triton preinstalled, no network and nothing installed from
this checkout. Three sections, each recorded on its own (a failure is written into the
JSON and the next section runs), run in the order c, b, a (the headline figures first;
the parts that compile hand-written GPU kernels last, (a) in a child process):

(a) `kernel_tests`: the default kernel tests of `tests/kernels/` with the compiled
    implementation this backend has (`KERNELS_TEST_IMPL`): on a CUDA GPU "triton", the
    Triton flash attention (`kernels/flash_attention_triton.py`) compiled; the other
    kernels compile through Mosaic for TPU only (VMEM scratch accumulators over
    sequential grid axes), so their tests run interpreted on the GPU, and the JSON says so.
(b) `attention`: causal attention at sequence 1k..8k, forward and forward + backward:
    the XLA reference (`kernels.flash_attention.attention_reference`, what the "tpu"
    device runs on a GPU), the Triton flash kernel (the TPU kernel through
    `benchmarks/kernels/kernels_bench.py` on a TPU), JAX's cuDNN attention
    (`jax.nn.dot_product_attention`) and `torch.nn.functional.scaled_dot_product_attention`
    on CUDA.
(c) `training`: a Llama-style decoder (RMSNorm, rotary embeddings, grouped-query SDPA,
    SwiGLU; about 125M parameters, bf16 weights, AdamW, sequence 2048) trained in the
    "tpu" device's strict, fused and compiled modes (the modes of
    `benchmarks/device/backend_bench.py`) against PyTorch CUDA eager and torch.compile
    (inductor) on the same GPU: step time (median after warm-up), first step (compiles
    included), tokens/s, MFU against `--peak-tflops` (H100/H200 bf16 dense: 989) and peak
    memory (torch's allocator for CUDA modes; JAX's `peak_bytes_in_use`, process-wide and
    never reset, for tpu modes).

A global time budget (`--budget`, default 450 s from process start) gives each section
a share; a watchdog writes what was measured and exits when the budget runs out, so the
command ends within 8 minutes whatever hangs. The JSON is rewritten after every part.
`--profile DIR` traces one extra training step per mode into DIR/<mode>
(`torch.tpu.profiler` for tpu modes: ATen ops, program launches and JAX's device trace).
`--smoke` runs the same code on CPU (or whatever is present) with tiny shapes, and
torch.compile with its "eager" backend instead of inductor: it checks the script, not speed.
"""

from __future__ import annotations

import os

# JAX and torch share one GPU: JAX must not grab 75% of it at start.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse
import contextlib
import dataclasses
import gc
import json
import re
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

STARTED = time.monotonic()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.harness import ROOT  # noqa: E402

DEFAULT_BUDGET_S = 450.0
# Dense bf16 peak FLOP/s by CUDA device name (vendors' data sheets, SXM parts), for MFU.
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12}
KERNEL_TEST_FILES = (
    "tests/kernels/test_flash_attention.py",
    "tests/kernels/test_flash_attention_triton.py",
    "tests/kernels/test_norms.py",
    "tests/kernels/test_cross_entropy.py",
    "tests/kernels/test_decode_attention.py",
)


# ----------------------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 32000
    dim: int = 768
    layers: int = 12
    heads: int = 12
    kv_heads: int = 4
    hidden: int = 2048  # SwiGLU inner width
    seq: int = 2048
    batch: int = 1

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class LlamaBlock(nn.Module):
    """Pre-norm block: rotary grouped-query SDPA (causal) and a SwiGLU MLP, both residual."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.attn_norm, self.mlp_norm = RMSNorm(c.dim), RMSNorm(c.dim)
        self.q = nn.Linear(c.dim, c.heads * c.head_dim, bias=False)
        self.kv = nn.Linear(c.dim, 2 * c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.dim, bias=False)
        self.gate_up = nn.Linear(c.dim, 2 * c.hidden, bias=False)
        self.down = nn.Linear(c.hidden, c.dim, bias=False)

    def forward(self, x, cos, sin):
        c, (batch, length, _) = self.c, x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(batch, length, c.heads, c.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(batch, length, 2, c.kv_heads, c.head_dim).permute(2, 0, 3, 1, 4)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=c.heads != c.kv_heads)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, length, c.dim))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.blocks = nn.ModuleList(LlamaBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)
        inv_freq = 1.0 / 10000.0 ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
        angles = torch.outer(torch.arange(c.seq, dtype=torch.float64), inv_freq).repeat(1, 2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def parameter_count(c: LlamaConfig) -> int:
    per_block = 2 * c.dim + c.dim * (c.heads + 2 * c.kv_heads) * c.head_dim + c.dim * c.dim + 3 * c.dim * c.hidden
    return 2 * c.vocab * c.dim + c.layers * per_block + c.dim


def step_flops(c: LlamaConfig) -> float:
    """Model FLOPs of forward + backward, the convention of `benchmarks/device/jax_mingpt.py`:
    6 * N * tokens (N without the embedding table, which is a lookup) plus
    12 * layers * dim * seq per token for attention (causal masking not discounted)."""
    tokens = c.batch * c.seq
    return 6 * (parameter_count(c) - c.vocab * c.dim) * tokens + 12 * c.layers * c.dim * c.seq * tokens


# ----------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Settings:
    attention_seqs: tuple
    attention_shape: tuple  # batch, heads, kv heads, head dim
    dtype: str
    warmup: int
    iters: int
    llama: LlamaConfig
    train_warmup: int
    train_steps: int
    native_compile_backend: str
    kernel_test_files: tuple
    kernel_test_selection: str | None  # pytest -k expression (None: the default selection)
    shares: dict  # section -> largest fraction of the budget left when it starts


GPU_SETTINGS = Settings(
    attention_seqs=(1024, 2048, 4096, 8192),
    attention_shape=(2, 16, 8, 128),
    dtype="bfloat16",
    warmup=2,
    iters=10,
    llama=LlamaConfig(),
    train_warmup=2,
    train_steps=8,
    native_compile_backend="inductor",
    kernel_test_files=KERNEL_TEST_FILES,
    kernel_test_selection=None,
    shares={"training": 0.6, "attention": 0.5, "kernel_tests": 1.0},
)
SMOKE_SETTINGS = Settings(
    attention_seqs=(64,),
    attention_shape=(1, 2, 1, 32),
    dtype="float32",
    warmup=1,
    iters=2,
    llama=LlamaConfig(vocab=64, dim=32, layers=1, heads=2, kv_heads=1, hidden=64, seq=16, batch=2),
    train_warmup=0,  # one step per mode: the smoke checks the code, not the time
    train_steps=1,
    native_compile_backend="eager",
    kernel_test_files=("tests/kernels/test_cross_entropy.py",),
    kernel_test_selection="test_cross_entropy and none",
    shares={"training": 0.6, "attention": 0.5, "kernel_tests": 1.0},
)


# ----------------------------------------------------------------------------- budget, report


class Budget:
    """`seconds` from process start."""

    def __init__(self, seconds: float):
        self.deadline = STARTED + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def deadline_after(self, seconds: float) -> "Budget":
        """A budget that ends `seconds` from now (or with this one, if sooner)."""
        return Budget(min(self.deadline, time.monotonic() + seconds) - STARTED)


def _error_text(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0][:400] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}"


class Report:
    """The JSON written after every part (atomically), so a stop keeps what was measured."""

    def __init__(self, path: str | None):
        self.path = path
        self.data: dict = {"sections": {}}
        self.running: str | None = None
        self._lock = threading.Lock()

    def write(self) -> None:
        if not self.path or self.path == "-":
            return
        with self._lock:
            for _ in range(3):  # another thread may be filling a dict: retry the snapshot
                try:
                    text = json.dumps(self.data, indent=1, default=str)
                    break
                except RuntimeError:
                    time.sleep(0.01)
            else:
                return
            tmp = f"{self.path}.tmp"
            Path(tmp).write_text(text + "\n")
            os.replace(tmp, self.path)

    @contextlib.contextmanager
    def section(self, name: str, budget: Budget, share: float):
        """Run one section: its entry records status, seconds and the error if it fails;
        `entry["time_limit_s"]` is its share of the budget left."""
        left = budget.left()
        entry = {"status": "running", "time_limit_s": round(max(0.0, left * share), 1)}
        self.data["sections"][name] = entry
        if left <= 5:
            entry["status"] = "skipped: global time budget spent"
            self.write()
            yield None
            return
        self.running = name
        self.write()
        start, cpu_start = time.monotonic(), time.process_time()
        try:
            yield entry
            entry["status"] = "ok" if not entry.get("failures") else "partial"
        except Exception as error:  # noqa: BLE001 - one section's failure must not lose the others
            entry["status"] = "failed"
            entry["error"] = _error_text(error)
            entry["traceback"] = traceback.format_exc()[-2000:]
        finally:
            entry["seconds"] = round(time.monotonic() - start, 2)
            entry["cpu_seconds"] = round(time.process_time() - cpu_start, 2)
            self.running = None
            self.write()


def start_watchdog(report: Report, budget: Budget, on_stop) -> threading.Timer:
    """At the deadline: mark the running section, write the JSON, print, exit(3)."""

    def stop():
        if report.running:
            report.data["sections"][report.running]["status"] = "stopped: global time budget spent"
        report.data["stopped_by_budget"] = True
        report.write()
        with contextlib.suppress(Exception):
            on_stop()
        sys.stdout.flush()
        os._exit(3)

    timer = threading.Timer(max(0.0, budget.left()), stop)
    timer.daemon = True
    timer.start()
    return timer


# ----------------------------------------------------------------------------- environment


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def native_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def peak_flops(requested_tflops: float | None) -> tuple[float | None, str]:
    if requested_tflops:
        return requested_tflops * 1e12, "--peak-tflops"
    if not torch.cuda.is_available():
        return None, "no CUDA device: MFU not computed"
    name = torch.cuda.get_device_name(0)
    for key, value in GPU_PEAK_FLOPS.items():
        if key in name:
            return value, f"bf16 dense peak of {key} (data sheet)"
    return None, f"unknown peak for {name!r}: pass --peak-tflops"


def environment(entry: dict, args) -> None:
    import jax

    entry["versions"] = {p: _version(p) for p in ("torch", "jax", "jaxlib", "triton", "transformers", "pytest")}
    entry["jax_backend"] = jax.default_backend()
    entry["jax_devices"] = [str(d) for d in jax.devices()]
    entry["torch_device"] = native_device()
    if torch.cuda.is_available():
        entry["cuda_device"] = torch.cuda.get_device_name(0)
        entry["torch_cuda"] = torch.version.cuda
    from tpu_backend import kernels as device_kernels

    entry["tpu_device_kernels"] = device_kernels.implementation()  # what SDPA/norms on "tpu" tensors run
    peak, source = peak_flops(args.peak_tflops)
    entry["peak_flops"], entry["peak_flops_source"] = peak, source


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "tpu":
        torch.tpu.synchronize()


# ----------------------------------------------------------------------------- (a) kernel tests


def compiled_kernels() -> str | None:
    """The compiled kernel implementation for JAX's backend: "pallas" (TPU), "triton"
    (CUDA GPU: `kernels.flash_attention_triton`) or None."""
    import jax

    from kernels._common import accelerator

    if accelerator():
        return "pallas"
    return "triton" if jax.default_backend() == "gpu" else None


_TEST_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")


def kernel_tests(entry: dict, settings: Settings) -> None:
    """pytest in a child process (`-v`, outcomes read from its lines): a kernel that
    crashes its compiler, or a test that hangs, costs this section only."""
    compiled = compiled_kernels()
    entry["compiled_implementation"] = compiled
    if compiled != "pallas":
        entry["note"] = (
            "the TPU kernels (kernels/flash_attention, norms, cross_entropy, decode_attention) compile "
            "through Mosaic for TPU only (VMEM scratch accumulators over sequential grid axes), so their "
            "tests ran the kernel bodies in Pallas's interpreter on this device; "
            + (
                "kernels/flash_attention_triton ran compiled by Triton"
                if compiled == "triton"
                else "kernels/flash_attention_triton compiles only on a CUDA GPU (here: interpreted, -m slow)"
            )
        )
    impl = compiled or "interpret"
    entry["implementation"] = impl
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "not slow", "--rootdir", str(ROOT)]
    command += [str(ROOT / f) for f in settings.kernel_test_files]
    if settings.kernel_test_selection:
        command += ["-k", settings.kernel_test_selection]
    env = dict(
        os.environ,
        KERNELS_TEST_IMPL=impl,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=max(5.0, entry["time_limit_s"] - 10)
        )
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as timeout:
        output = (timeout.stdout or b"").decode() if isinstance(timeout.stdout, bytes) else (timeout.stdout or "")
        code = None
    entry["exit_code"] = code
    entry["tests"] = [
        {"test": m.group(1), "outcome": m.group(2).lower()} for m in map(_TEST_LINE.match, output.splitlines()) if m
    ]
    counts = {}
    for test in entry["tests"]:
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    entry["counts"] = counts
    failed = [t["test"] for t in entry["tests"] if t["outcome"] in ("failed", "error")]
    if code not in (0, 5) or failed:
        entry["failures"] = failed + ([] if code is not None else ["stopped: the section's time share ran out"])
        entry["output_tail"] = output[-4000:]
    if not entry["tests"]:
        raise RuntimeError(f"no kernel test ran (pytest exit code {code}): {output[-600:]}")


# ----------------------------------------------------------------------------- (b) attention


def _torch_time(fn, device: str, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _torch_sdpa(q, k, v, dout, device: str, settings: Settings) -> dict:
    import numpy as np

    dtype = getattr(torch, settings.dtype)
    tq, tk, tv, tdo = (torch.from_numpy(np.array(t, np.float32)).to(device, dtype) for t in (q, k, v, dout))
    gqa = tq.shape[1] != tk.shape[1]
    attend = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=gqa)
    with torch.no_grad():
        forward_ms = _torch_time(lambda: attend(tq, tk, tv), device, settings.warmup, settings.iters)
        out = attend(tq, tk, tv)
    leaves = [t.detach().requires_grad_(True) for t in (tq, tk, tv)]

    def forward_backward():
        torch.autograd.grad(attend(*leaves), leaves, tdo)

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    fwd_bwd_ms = _torch_time(forward_backward, device, settings.warmup, settings.iters)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return {"fwd_ms": forward_ms, "fwd_bwd_ms": fwd_bwd_ms, "peak_bytes": peak, "out": out.float().cpu().numpy()}


def _jax_attention(fn, args, dout, settings: Settings) -> dict:
    import jax

    from benchmarks.kernels import kernels_bench

    forward = jax.jit(fn)
    fwd_bwd = jax.jit(lambda *a: jax.vjp(fn, *a)[1](dout))
    out = forward(*args)
    return {
        "fwd_ms": kernels_bench._time(forward, args, settings.warmup, settings.iters),
        "fwd_bwd_ms": kernels_bench._time(fwd_bwd, args, settings.warmup, settings.iters),
        "temp_bytes": kernels_bench._temp_bytes(fwd_bwd, args),
        "out": out,
    }


def _cudnn_attention(q, k, v, dout, settings: Settings) -> dict:
    """JAX's cuDNN flash attention (layout (B, L, H, D)); GPU only."""
    import jax
    import jax.numpy as jnp

    to_blhd = lambda t: jnp.swapaxes(t, 1, 2)

    def attend(a, b, c):
        out = jax.nn.dot_product_attention(to_blhd(a), to_blhd(b), to_blhd(c), is_causal=True, implementation="cudnn")
        return to_blhd(out)

    return _jax_attention(attend, (q, k, v), dout, settings)


def attention(entry: dict, settings: Settings, budget_s: float, save) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.kernels import kernels_bench
    from kernels import flash_attention as fa
    from kernels.flash_attention_triton import flash_attention_triton

    deadline = time.monotonic() + budget_s
    dtype = getattr(jnp, settings.dtype)
    batch, heads, kv_heads, head_dim = settings.attention_shape
    device = native_device()
    compiled = compiled_kernels()
    entry.update(
        shape=f"B{batch} H{heads}/{kv_heads} D{head_dim} causal {settings.dtype}",
        jax_backend=jax.default_backend(),
        torch_device=device,
        compiled_kernel=compiled or "none on this backend: the 'tpu' device runs the XLA reference",
        rows=[],
    )
    implementations = ["xla_reference", "torch_sdpa"]
    if compiled == "pallas":
        implementations.insert(0, "flash_kernel")
    if compiled == "triton":
        implementations.insert(0, "flash_triton")
    if jax.default_backend() == "gpu":
        implementations.insert(1, "jax_cudnn")
    for seq in settings.attention_seqs:
        if time.monotonic() > deadline:
            entry.setdefault("failures", []).append(f"seq {seq} and longer: section time share spent")
            break
        keys = jax.random.split(jax.random.PRNGKey(seq), 4)
        q = jax.random.normal(keys[0], (batch, heads, seq, head_dim), dtype)
        k = jax.random.normal(keys[1], (batch, kv_heads, seq, head_dim), dtype)
        v = jax.random.normal(keys[2], (batch, kv_heads, seq, head_dim), dtype)
        dout = jax.random.normal(keys[3], q.shape, dtype)
        row = {"seq": seq, "fwd_ms": {}, "fwd_bwd_ms": {}, "temp_bytes": {}, "errors": {}}
        outputs = {}
        entry["rows"].append(row)
        for impl in implementations:
            if time.monotonic() > deadline:
                row["errors"][impl] = "not run: section time share spent"
                continue
            try:
                if impl == "flash_kernel":
                    kernel = kernels_bench.bench_attention(
                        seq, {"attention": settings.attention_shape}, compiled, dtype, settings.warmup, settings.iters
                    )
                    result = {
                        "fwd_ms": kernel.fwd_ms[compiled],
                        "fwd_bwd_ms": kernel.fwd_bwd_ms[compiled],
                        "temp_bytes": kernel.temp_bytes[compiled],
                    }
                elif impl == "flash_triton":
                    result = _jax_attention(
                        lambda a, b, c: flash_attention_triton(a, b, c, causal=True), (q, k, v), dout, settings
                    )
                elif impl == "xla_reference":
                    result = _jax_attention(
                        lambda a, b, c: fa.attention_reference(a, b, c, None, True)[0], (q, k, v), dout, settings
                    )
                elif impl == "jax_cudnn":
                    result = _cudnn_attention(q, k, v, dout, settings)
                else:
                    result = _torch_sdpa(q, k, v, dout, device, settings)
                    if result.get("peak_bytes") is not None:
                        row["torch_peak_bytes"] = result["peak_bytes"]
            except Exception as error:  # noqa: BLE001 - e.g. out of memory at 8k: record, go on
                row["errors"][impl] = _error_text(error)
                continue
            row["fwd_ms"][impl] = round(result["fwd_ms"], 4)
            row["fwd_bwd_ms"][impl] = round(result["fwd_bwd_ms"], 4)
            if result.get("temp_bytes") is not None:
                row["temp_bytes"][impl] = result["temp_bytes"]
            if "out" in result:
                outputs[impl] = np.asarray(result["out"], np.float32)
        if "xla_reference" in outputs:  # agreement with the reference (a sanity check)
            reference = outputs["xla_reference"]
            scale = max(float(np.max(np.abs(reference))), 1e-6)
            row["max_rel_diff_vs_xla"] = {
                impl: float(np.max(np.abs(out - reference)) / scale)
                for impl, out in outputs.items()
                if impl != "xla_reference"
            }
        if row["errors"]:
            entry.setdefault("failures", []).append(f"seq {seq}: {', '.join(row['errors'])}")
        del q, k, v, dout, outputs
        gc.collect()
        save()


# ----------------------------------------------------------------------------- (c) training


def training_modes(settings: Settings) -> dict:
    """name -> (device, eager mode or None, model wrapper, description). The tpu modes are
    `benchmarks/device/backend_bench.py`'s; the native ones run on CUDA (CPU in a smoke run)."""
    from benchmarks.device import backend_bench

    device = native_device()
    compile_backend = settings.native_compile_backend
    modes = {
        f"{device}-eager": (device, None, lambda m: m, f"PyTorch {device} eager (the reference)"),
        f"{device}-{compile_backend if compile_backend != 'eager' else 'dynamo'}": (
            device,
            None,
            lambda m: torch.compile(m, backend=compile_backend),
            f'torch.compile(backend="{compile_backend}") on {device}',
        ),
    }
    for name in ("tpu-compile", "tpu-strict", "tpu-fused"):
        mode = backend_bench.MODES[name]
        modes[name] = ("tpu", mode.eager_mode, mode.prepare, mode.description)
    return modes


def _memory_before(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    elif device == "tpu":
        torch.tpu.reset_peak_memory_stats()


def _memory_after(device: str) -> dict:
    if device == "cuda":
        return {"peak_bytes": torch.cuda.max_memory_allocated(), "kind": "torch.cuda.max_memory_allocated"}
    if device == "tpu":
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        return {
            "peak_bytes": stats.get("peak_bytes_in_use"),
            "kind": "JAX peak_bytes_in_use (process-wide, not reset between modes)",
            "live_tensor_peak_bytes": torch.tpu.max_memory_allocated(),
        }
    return {"peak_bytes": None, "kind": "not reported on CPU"}


def _profile_one_step(step, device: str, folder: str) -> dict:
    """One more step under a profiler: `torch.tpu.profiler` for tpu modes (host ATen ops,
    program launches, JAX's device trace), PyTorch's (CPU + CUDA activities) otherwise."""
    try:
        if device == "tpu":
            with torch.tpu.profiler.profile(folder) as prof:
                step()
            return prof.files
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            step()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        return {"host": path}
    except Exception as error:  # noqa: BLE001 - a failed trace must not lose the timings
        return {"error": _error_text(error)}


def train_mode(
    name: str, mode: tuple, settings: Settings, time_limit_s: float, peak: float | None, profile_dir: str | None = None
) -> dict:
    """Build the model in `mode`, run warm-up then timed steps (at least one, at most
    `settings.train_steps`, stopping at `time_limit_s`); step time, tokens/s, MFU, memory.
    With `profile_dir`, one more step is traced into `profile_dir/<mode>`."""
    device, eager_mode, prepare, description = mode
    config = settings.llama
    result = {"description": description}
    start, cpu_start = time.monotonic(), time.process_time()
    if device == "tpu":
        import tpu_backend

        tpu_backend.set_eager_mode(eager_mode)
    _memory_before(device)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Llama(config).to(torch.bfloat16).to(device)
    runner = prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    tokens = torch.randint(0, config.vocab, (config.batch, config.seq + 1), generator=torch.Generator().manual_seed(0))
    inputs, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    def step() -> float:
        if device == "tpu":
            tpu_backend.set_eager_mode(eager_mode)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = runner(inputs)
        loss = F.cross_entropy(logits.reshape(-1, config.vocab).float(), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        _sync(device)
        result.setdefault("losses", []).append(round(loss.item(), 5))
        return time.perf_counter() - started

    try:
        warmup = [step() for _ in range(settings.train_warmup)]
        timed = []
        while len(timed) < settings.train_steps and (not timed or time.monotonic() - start < time_limit_s):
            timed.append(step())
        result["first_step_s"] = round((warmup or timed)[0], 3)  # compiles included
        if profile_dir:
            result["profile"] = _profile_one_step(step, device, os.path.join(profile_dir, name))
    finally:
        if device == "tpu":
            tpu_backend.set_eager_mode("strict")  # fused: runs what is pending
    median = statistics.median(timed)
    tokens_per_step = config.batch * config.seq
    result.update(
        step_ms=round(median * 1e3, 2),
        timed_steps=len(timed),
        tokens_per_s=round(tokens_per_step / median, 1),
        tflops=round(step_flops(config) / median / 1e12, 3),
        mfu=None if peak is None else round(step_flops(config) / median / peak, 4),
        **_memory_after(device),
        seconds=round(time.monotonic() - start, 2),
        cpu_seconds=round(time.process_time() - cpu_start, 2),
    )
    return result


def training(
    entry: dict, settings: Settings, budget: Budget, peak: float | None, save, profile_dir: str | None = None
) -> None:
    import jax

    config = settings.llama
    entry.update(
        model=dataclasses.asdict(config),
        parameters=parameter_count(config),
        flops_per_step=step_flops(config),
        peak_flops=peak,
        dtype="bfloat16 weights, AdamW, loss in float32",
        modes={},
    )
    modes = training_modes(settings)
    for index, (name, mode) in enumerate(modes.items()):
        share = budget.left() / (len(modes) - index)
        if mode[0] == "tpu" and jax.default_backend() == "cpu" and native_device() == "cuda":
            entry["modes"][name] = {"error": "skipped: JAX has no GPU backend here (install jax[cuda])"}
            entry.setdefault("failures", []).append(name)
            continue
        if budget.left() < 5:
            entry["modes"][name] = {"error": "skipped: global time budget spent"}
            entry.setdefault("failures", []).append(name)
            continue
        try:
            entry["modes"][name] = train_mode(name, mode, settings, share * 0.8, peak, profile_dir)
        except Exception as error:  # noqa: BLE001 - one mode's failure must not lose the others
            entry["modes"][name] = {"error": _error_text(error), "traceback": traceback.format_exc()[-1500:]}
            entry.setdefault("failures", []).append(name)
        finally:
            gc.collect()
            save()
    losses = {n: m["losses"][0] for n, m in entry["modes"].items() if m.get("losses")}
    if losses:  # same weights and batch in every mode: the first loss must agree (bf16)
        reference = next(iter(losses.values()))
        entry["first_losses_agree"] = all(
            abs(v - reference) <= 0.05 * max(abs(reference), 1.0) for v in losses.values()
        )


# ----------------------------------------------------------------------------- table


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_tables(data: dict) -> None:
    sections = data.get("sections", {})
    out = [f"accelerator check ({'SMOKE: tiny shapes, not performance' if data.get('smoke') else 'full'})"]
    for name, entry in sections.items():
        out.append(f"  [{name}] {entry.get('status')}" + (f": {entry['error']}" if entry.get("error") else ""))
    tests = sections.get("kernel_tests", {})
    if tests.get("counts") is not None:
        out.append(f"\n(a) kernel tests, implementation {tests.get('implementation')}: {tests['counts']}")
        if tests.get("note"):
            out.append(f"    {tests['note']}")
    rows = sections.get("attention", {}).get("rows") or []
    if rows:
        impls = sorted({i for r in rows for i in list(r["fwd_ms"]) + list(r["errors"])})
        out.append(f"\n(b) causal attention, {sections['attention'].get('shape')}: ms forward / forward+backward")
        out.append("  " + "seq".ljust(7) + "".join(i.rjust(24) for i in impls))
        for r in rows:
            cells = [
                "failed"
                if i in r["errors"]
                else f"{_fmt(r['fwd_ms'].get(i), '.3f')} / {_fmt(r['fwd_bwd_ms'].get(i), '.3f')}"
                for i in impls
            ]
            out.append("  " + str(r["seq"]).ljust(7) + "".join(c.rjust(24) for c in cells))
    train = sections.get("training", {})
    if train.get("modes"):
        peak = train.get("peak_flops")
        out.append(
            f"\n(c) Llama training step: {train['parameters'] / 1e6:.3g}M parameters, seq {train['model']['seq']}, "
            f"batch {train['model']['batch']}, {train['flops_per_step'] / 1e12:.3g} TFLOP per step; "
            f"MFU vs {_fmt(peak and peak / 1e12, '.0f')} TFLOP/s"
        )
        out.append(
            "  "
            + "mode".ljust(18)
            + "step ms".rjust(10)
            + "first s".rjust(9)
            + "tokens/s".rjust(11)
            + "TFLOP/s".rjust(9)
            + "MFU".rjust(8)
            + "peak GiB".rjust(10)
            + "  loss"
        )
        for name, m in train["modes"].items():
            if m.get("error"):
                out.append("  " + name.ljust(18) + f"  failed: {m['error']}")
                continue
            gib = None if m.get("peak_bytes") is None else m["peak_bytes"] / 2**30
            out.append(
                "  "
                + name.ljust(18)
                + _fmt(m["step_ms"], ".1f").rjust(10)
                + _fmt(m["first_step_s"], ".1f").rjust(9)
                + _fmt(m["tokens_per_s"], ".0f").rjust(11)
                + _fmt(m["tflops"], ".1f").rjust(9)
                + (_fmt(m["mfu"] * 100 if m["mfu"] is not None else None, ".1f") + "%").rjust(8)
                + _fmt(gib, ".2f").rjust(10)
                + f"  {m['losses'][-1]}"
            )
    out.append(f"\ntotal {data.get('seconds', time.monotonic() - STARTED):.0f} s")
    print("\n".join(out), flush=True)


# ----------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default="accelerator_check.json", help="output file ('-': stdout)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, any device: checks the script runs")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds from start, all sections")
    parser.add_argument(
        "--sections", default="kernel_tests,attention,training", help="comma list of kernel_tests, attention, training"
    )
    parser.add_argument(
        "--profile", metavar="DIR", default=None, help="trace one extra training step per mode into DIR/<mode>"
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s for MFU (default: by GPU name)"
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    settings = SMOKE_SETTINGS if args.smoke else GPU_SETTINGS
    if args.smoke:
        torch.set_num_threads(1)  # tiny ops: threads only add contention on a shared machine
    budget = Budget(args.budget)
    report = Report(args.json)
    report.data.update(smoke=args.smoke, budget_s=args.budget, settings=dataclasses.asdict(settings))
    start_watchdog(report, budget, lambda: print_tables(report.data))
    with report.section("environment", budget, 1.0) as entry:
        import tpu_backend  # noqa: F401 - registers the "tpu" device (its ops run on JAX's backend)

        environment(entry, args)
    peak = report.data["sections"]["environment"].get("peak_flops")
    wanted = args.sections.split(",")
    # Training first (the headline figures, and nothing in it compiles hand-written
    # kernels); the sections that compile the Triton kernel come after it.
    if "training" in wanted:
        with report.section("training", budget, settings.shares["training"]) as entry:
            if entry is not None:
                training(
                    entry, settings, budget.deadline_after(entry["time_limit_s"]), peak, report.write, args.profile
                )
    if "attention" in wanted:
        with report.section("attention", budget, settings.shares["attention"]) as entry:
            if entry is not None:
                attention(entry, settings, entry["time_limit_s"], report.write)
    if "kernel_tests" in wanted:
        with report.section("kernel_tests", budget, settings.shares["kernel_tests"]) as entry:
            if entry is not None:
                kernel_tests(entry, settings)
    report.data["seconds"] = round(time.monotonic() - STARTED, 1)
    report.write()
    print_tables(report.data)
    if args.json == "-":
        print(json.dumps(report.data, indent=1, default=str))
    failed = [n for n, e in report.data["sections"].items() if e["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
