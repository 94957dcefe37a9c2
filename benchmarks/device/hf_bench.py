"""Hugging Face as users run it on the "tpu" device: transformers' generate() and a diffusers pipeline.

    python -m benchmarks.device.hf_bench                                  # both sections, chip sizes
    python -m benchmarks.device.hf_bench --sections generate --batches 1,8 --caches default,static
    python -m benchmarks.device.hf_bench --sections diffusers --sd-modes cpu,tpu-eager,tpu-compiled
    python -m benchmarks.device.hf_bench --smoke --json /tmp/hf.json      # tiny sizes: seconds on a CPU
    python -m benchmarks.device.hf_bench --sections calls                 # a user's calls: stalls, processors

`generate`: a Llama shaped like TinyLlama 1.1B (d 2048, 22 layers, 32 heads, 4 kv heads,
FFN 5632, vocabulary 32000; `--layers` etc. to change it) in bfloat16 with random
weights, `LlamaForCausalLM.generate` greedy from a `--prompt`-token prompt on the device.
Per batch and cache: the first generate() call's seconds (compilation included; the
first row of the run pays for what later rows reuse), taken as a 1-new-token call (the
prefill: "of it prefill"; a prompt of up to `prompt_steps.MAX_TOKENS` tokens goes through the
decode step, which then compiles here) and then the full call, and where its compiling went
(Dynamo's trace, AOTAutograd, XLA with our lowering, the strict per-op programs), and decode ms per token,
`(t(N new tokens) - t(1 new token)) / (N - 1)` (the prefill cancels), median of
`--repeats`, against the HBM-bandwidth bound: the bytes a decode step must read (every
weight but the input embedding, of which it reads one row per sequence) over
`--hbm-gbps` (819 GB/s, TPU v5e). Caches: `default` (nothing passed: on the device a
static cache of bucketed length whose decode step transformers compiles with backend
"tpu", one program per token), `static` (`cache_implementation="static"`: transformers'
sizing, which keeps the largest length the model allocated before, so after `default` it
reuses that length and its programs; compiled the same way), `dynamic` (transformers'
DynamicCache: a shape per token, eager). `--loops`: greedy decoding with the device's loop
(the compiled step picks the token, the host reads it one step late) and/or transformers'
own loop (the host picks each token from the step's logits), in the same process.
`--layer-regions on,off`: the decoder layers traced once as nested compile regions (the
default; `transformers.COMPILE_LAYERS_ONCE`) or each traced in turn, in the same process (the
second row reuses what the first compiled: for first-call times, one per process).
`--trace DIR`: after the first row's timings, one more generate() of that row runs under
JAX's profiler (the trace is written under DIR); the table below the results splits its
decode time per token into the chip's busy time (XLA programs on the device) and the rest
(the host: Python, Dynamo's guards, transfers, waiting), and names the host functions
that took longest per token (inclusive times, slowed by the tracer). `--profile FILE`: the first row's first full
call (where the decode step compiles) under cProfile, its top functions printed. `--parts`: one more
pair of calls (N tokens, 1 token) of the first row with a few functions timed (no tracer):
per token, the wait for the step and its logits, building the inputs and mask, the
compiled call (reading its inputs), and the rest.

`calls`: the calls a user makes, in order (`bench_calls`): the first call of a fresh
process, 257 new tokens after it and a 100-token prompt after it (each call's seconds and
the compiling in them: a stall), decode ms/token plain and with `min_new_tokens`, the first
call in a second process, and generate() after `Trainer.train()` (programs compiled).

`diffusers`: a StableDiffusionPipeline from small configs with random weights (CLIP text
encoder, a UNet with SD 1.x's layout of width `--unet-width`, a four-level VAE; prompts
as token ids through `prompt_embeds`, nothing downloaded), `--sd-steps` DDIM steps at
`--sd-size` pixels: seconds per image on CPU (PyTorch eager), on "tpu" eager and with the
UNet `torch.compile(backend="tpu")`, the first call's seconds, the ratio to CPU and the
image's largest difference from CPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import traceback
from pathlib import Path

import torch
from rich.table import Table

import tpu_backend  # noqa: F401  (the "tpu" device)
from benchmarks.harness import console as wide_console
from benchmarks.harness import table, write_json
from tpu_backend.integrations import greedy_decoding
from tpu_backend.integrations import transformers as hf_integration

LLAMA_1B = dict(dim=2048, layers=22, heads=32, kv_heads=4, ffn=5632, vocab=32000)
SMOKE = dict(dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256, prompt=8, new_tokens=16, repeats=3,
             batches="1", caches="default", unet_width=32, sd_size=32, sd_steps=2, sd_modes="cpu,tpu-eager")  # fmt: skip
HBM_GBPS_V5E = 819.0
PROFILER_FRAMES = ("profiler.py", "contextlib.py", "hf_bench.py")  # the trace's own Python frames, not listed
console = wide_console()


def synchronize() -> None:
    torch.tpu.synchronize()


# ---- generate ------------------------------------------------------------------------------
def llama(opts):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=opts.vocab, hidden_size=opts.dim, intermediate_size=opts.ffn, num_hidden_layers=opts.layers,
        num_attention_heads=opts.heads, num_key_value_heads=opts.kv_heads, max_position_embeddings=4096,
        tie_word_embeddings=False, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None  # random weights: always generate N tokens
    return model.to("tpu")


def decode_bytes(model) -> int:
    """Bytes one decode step reads: every weight but the input embedding (one row per sequence)."""
    embedding = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding)


def timed_generate(model, ids, new_tokens: int, cache: str) -> tuple[float, torch.Tensor]:
    options = dict(max_new_tokens=new_tokens, do_sample=False)
    if cache != "default":
        options["cache_implementation"] = cache
    start = time.perf_counter()
    out = model.generate(ids, **options).cpu()  # the tokens on the host: the call is over
    return time.perf_counter() - start, out


@contextlib.contextmanager
def profiled(path: Path | None, top: int = 45):
    """cProfile of the block into `path` (None: no profiler), and its functions with the most
    cumulative time printed (the first call's compile: where the host's seconds go)."""
    if path is None:
        yield
        return
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)


def compile_seconds() -> dict[str, float]:
    """Compile seconds so far: Dynamo's trace, AOTAutograd, XLA (torch.compile's programs,
    our lowering included) and strict per-op programs (the prefill runs op by op)."""
    from torch._dynamo.utils import compilation_time_metrics as timers

    from tpu_backend.compile import compile_stats

    dynamo, aot = (
        float(sum(timers.get(name, ()))) for name in ("_compile.compile_inner", "OutputGraph.call_user_compiler")
    )
    return dict(dynamo=dynamo - aot, aot=aot, xla=compile_stats().total().compile_seconds,
                per_op=torch.tpu.cache_stats()["compile_seconds"])  # fmt: skip


def bench_generate(opts) -> list[dict]:
    start = time.perf_counter()
    model = llama(opts)
    synchronize()
    build_s = time.perf_counter() - start
    bound_ms = 1e3 * decode_bytes(model) / (opts.hbm_gbps * 1e9)
    params = sum(p.numel() for p in model.parameters())
    rows, tokens = [], {}
    loop_default, regions_default = greedy_decoding.ENABLED, hf_integration.COMPILE_LAYERS_ONCE
    for batch in [int(b) for b in opts.batches.split(",")]:
        ids = torch.randint(0, opts.vocab, (batch, opts.prompt), generator=torch.Generator().manual_seed(1)).to("tpu")
        cases = [(c, lp, r) for c in opts.caches.split(",") for lp in opts.loops.split(",") for r in opts.layer_regions.split(",")]  # fmt: skip
        for cache, loop, regions in cases:
            greedy_decoding.ENABLED = loop == "device"
            hf_integration.COMPILE_LAYERS_ONCE = regions == "on"
            row = dict(batch=batch, cache=cache, loop=loop, regions=regions, params=params, build_s=build_s, bound_ms=bound_ms)  # fmt: skip
            try:
                # the first call in two parts: a 1-token call (the prefill), then the rest
                before = compile_seconds()
                row["first_prefill_s"] = timed_generate(model, ids, 1, cache)[0]
                with profiled(opts.profile if not rows else None):
                    seconds, out = timed_generate(model, ids, opts.new_tokens, cache)
                row["first_call_s"] = row["first_prefill_s"] + seconds
                row["first_call_compile_s"] = {k: v - before[k] for k, v in compile_seconds().items()}
                full, prefill = [], []
                for _ in range(opts.repeats):
                    full.append(timed_generate(model, ids, opts.new_tokens, cache)[0])
                    prefill.append(timed_generate(model, ids, 1, cache)[0])
                row["decode_ms"] = 1e3 * (statistics.median(full) - statistics.median(prefill)) / (opts.new_tokens - 1)
                row["generate_s"] = statistics.median(full)
                row["x_bound"] = row["decode_ms"] / bound_ms
                tokens.setdefault((batch, loop, regions), out)
                if opts.trace and not any("trace" in r for r in rows):
                    row["trace"] = traced_generate(model, ids, opts, cache)
                if opts.parts and not any("parts" in r for r in rows):
                    row["parts"] = decode_parts(model, ids, opts, cache)
                # every cache: the same greedy tokens (per loop and layer tracing: their steps are different
                # programs, and a bfloat16 near-tie between two logits can fall either way)
                row["tokens_agree"] = bool(torch.equal(out, tokens[(batch, loop, regions)]))
            except Exception as error:  # a failing case is reported, the others still run
                row["error"] = f"{type(error).__name__}: {error}"[:300]
                traceback.print_exc()
            rows.append(row)
            console.print(row)
    greedy_decoding.ENABLED, hf_integration.COMPILE_LAYERS_ONCE = loop_default, regions_default
    return rows


# Where a decode step's time goes (`--parts`): the functions timed, each inclusive.
DECODE_PARTS = (
    ("waiting for the step and reading its logits", "tpu_backend.tensor", None, "to_cpu_tensor"),
    ("building the step's inputs and mask", "transformers.generation.utils", "GenerationMixin", "prepare_inputs_for_generation"),
    ("the compiled step's call", "tpu_backend.compile.compiled_graph", "CompiledGraph", "__call__"),
    ("  of it reading its inputs", "tpu_backend.compile.compiled_graph", None, "_read_inputs"),
)  # fmt: skip
PART_LABELS = [label for label, *_ in DECODE_PARTS]


def decode_parts(model, ids, opts, cache: str) -> dict:
    """Per generated token, ms spent in each of DECODE_PARTS (wall clock, no tracer): the
    difference between an N-token and a 1-token call, as for decode_ms."""
    import importlib

    spent: dict[str, float] = {}
    originals = []
    for label, module_name, owner_name, name in DECODE_PARTS:
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        original = getattr(owner, name)

        def timed(*args, _original=original, _label=label, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - start

        originals.append((owner, name, original))
        setattr(owner, name, timed)
    try:
        runs = {}
        for tokens in (opts.new_tokens, 1):
            spent.clear()
            wall = timed_generate(model, ids, tokens, cache)[0]
            runs[tokens] = dict(spent, wall=wall)
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    long, short = runs[opts.new_tokens], runs[1]
    per_token = {
        k: 1e3 * (long.get(k, 0.0) - short.get(k, 0.0)) / (opts.new_tokens - 1) for k in ("wall", *PART_LABELS)
    }
    per_token["the rest (transformers' loop, Dynamo's guards, ...)"] = per_token["wall"] - sum(
        per_token[label] for label in PART_LABELS if not label.startswith(" ")
    )
    return per_token


def traced_generate(model, ids, opts, cache: str) -> dict:
    """One warm generate() under JAX's profiler: per token, the device's busy time and wall time."""
    import jax

    opts.trace.mkdir(parents=True, exist_ok=True)
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 1  # Python functions on the host's timeline (not every platform's default)
    with jax.profiler.trace(str(opts.trace), profiler_options=options):
        wall = timed_generate(model, ids, opts.new_tokens, cache)[0]
    newest = max(opts.trace.rglob("*.xplane.pb"), key=lambda path: path.stat().st_mtime)
    profile = jax.profiler.ProfileData.from_file(str(newest))
    device_ns, host = 0, {}
    for plane in profile.planes:
        for line in plane.lines:
            if plane.name.startswith("/device:") and line.name == "XLA Modules":
                device_ns += sum(event.duration_ns for event in line.events)
            elif plane.name.startswith("/host:"):
                for event in line.events:
                    if event.name.startswith("$") and not any(own in event.name for own in PROFILER_FRAMES):
                        host[event.name] = host.get(event.name, 0) + event.duration_ns
    per_token = 1e6 * opts.new_tokens
    slowest = sorted(host.items(), key=lambda item: -item[1])[: opts.trace_top]
    return dict(
        file=str(newest),
        wall_ms_per_token=1e3 * wall / opts.new_tokens,
        device_ms_per_token=device_ns / per_token,
        host_ms_per_token={name: ns / per_token for name, ns in slowest},
    )


def trace_table(trace: dict) -> Table:
    table = Table(title=f"one traced generate(), per token: wall {trace['wall_ms_per_token']:.2f} ms (tracer on), "
                  f"device busy {trace['device_ms_per_token']:.2f} ms")  # fmt: skip
    table.add_column("host function (inclusive)")
    table.add_column("ms/token", justify="right")
    for name, ms in trace["host_ms_per_token"].items():
        table.add_row(name[-90:], f"{ms:.3f}")
    return table


def generate_table(rows: list[dict], opts) -> Table:
    table = Table(title=f"generate(): Llama {opts.layers}x{opts.dim} bf16, prompt {opts.prompt}, {opts.new_tokens} new")
    columns = ("batch", "cache", "loop", "layer regions", "first call s", "of it prefill s", "compile s Dynamo/AOT/XLA/op",
               "decode ms/token", "HBM bound ms", "x bound")  # fmt: skip
    for column in (*columns, "tokens agree"):
        table.add_column(column, justify="right")
    for r in rows:
        if "error" in r:
            table.add_row(
                str(r["batch"]), r["cache"], r["loop"], r["regions"], r["error"][:60], *[""] * (len(columns) - 4)
            )
            continue
        table.add_row(
            str(r["batch"]), r["cache"], r["loop"], r["regions"], f"{r['first_call_s']:.1f}", f"{r['first_prefill_s']:.1f}",
            " / ".join(f"{r['first_call_compile_s'][k]:.1f}" for k in ("dynamo", "aot", "xla", "per_op")),
            f"{r['decode_ms']:.2f}", f"{r['bound_ms']:.2f}",
            f"{r['x_bound']:.2f}", str(r["tokens_agree"]),
        )  # fmt: skip
    return table


# ---- a user's calls: the first, longer ones, processors, a second process, after training ---
def compiled_so_far() -> tuple[float, int]:
    """(compile seconds, programs compiled) so far: what a call's stall is made of."""
    from tpu_backend.compile import compile_stats

    seconds = compile_seconds()
    total = compile_stats().total()
    return sum(seconds.values()), total.misses + torch.tpu.cache_stats()["misses"]


def timed_call(model, prompt_len: int, new_tokens: int, **options) -> dict:
    """One greedy generate() (all its tokens on the host at the end): its seconds and the
    compile seconds and programs it spent."""
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    (compile_before, programs_before), start = compiled_so_far(), time.perf_counter()
    model.generate(ids.to("tpu"), max_new_tokens=new_tokens, do_sample=False, **options).cpu()
    seconds = time.perf_counter() - start
    compile_after, programs_after = compiled_so_far()
    return dict(seconds=seconds, compile_s=compile_after - compile_before, programs=programs_after - programs_before)


def decode_ms(model, opts, **options) -> float:
    """ms per token: (t(N new tokens) - t(1 new token)) / (N - 1), medians of `--repeats`,
    after one untimed call of each (the options' own programs compile there)."""
    timed_call(model, opts.prompt, opts.new_tokens, **options), timed_call(model, opts.prompt, 1, **options)
    full = [timed_call(model, opts.prompt, opts.new_tokens, **options)["seconds"] for _ in range(opts.repeats)]
    one = [timed_call(model, opts.prompt, 1, **options)["seconds"] for _ in range(opts.repeats)]
    return 1e3 * (statistics.median(full) - statistics.median(one)) / (opts.new_tokens - 1)


def bench_calls(opts) -> dict:
    """Issue 66's generate() rows, in the order a user makes the calls: the first call of a
    fresh process (prompt `--prompt`, `--new-tokens` new), 257 new tokens after it, a prompt of
    100 after the `--prompt`-token one, decode ms/token plain and with `min_new_tokens` (its
    processor kept in the compiled step), the first call again in a second process (the
    compilation caches on disk), and generate() of 32 new tokens after `Trainer.train()` of a
    2-layer Llama in a process of its own (programs compiled)."""
    import subprocess

    from benchmarks.harness import module_command, repo_env

    model = llama(opts)
    rows = {"first call": timed_call(model, opts.prompt, opts.new_tokens)}
    rows["257 new tokens after it"] = timed_call(model, opts.prompt, 257)
    rows["a 100-token prompt after it"] = timed_call(model, 100, opts.new_tokens)
    plain, with_eos = decode_ms(model, opts), decode_ms(model, opts, eos_token_id=1)
    suppressed = decode_ms(model, opts, min_new_tokens=opts.new_tokens, eos_token_id=1)
    rows["decode ms/token"] = dict(plain=plain, eos=with_eos, min_new_tokens=suppressed, ratio=suppressed / plain)
    child = [*map(str, ("--sections", "calls-child", "--prompt", opts.prompt, "--new-tokens", opts.new_tokens))]
    child += [
        f"--{k.replace('_', '-')}={getattr(opts, k)}" for k in ("dim", "layers", "heads", "kv_heads", "ffn", "vocab")
    ]
    for name, argv in (
        ("first call, second process", child),
        ("32 tokens after Trainer.train()", ["--sections", "after-train"]),
    ):
        done = subprocess.run(
            module_command("benchmarks.device.hf_bench", *argv), env=repo_env(), capture_output=True, text=True
        )
        if done.returncode:
            rows[name] = dict(error=done.stderr[-2000:])
        else:
            rows[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def first_call_row(opts) -> dict:
    """`calls`' second process: the first call again (its programs read from the disk cache)."""
    return timed_call(llama(opts), opts.prompt, opts.new_tokens)


def after_train_row(opts) -> dict:
    """A 2-layer Llama (d 64) trained by `Trainer` for 4 steps, then greedy generate() of 32
    new tokens in the same process: the programs that call compiled."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    rows = torch.randint(0, 256, (16, 64), generator=torch.Generator().manual_seed(1))
    args = transformers.TrainingArguments("/tmp/hf_bench_train", per_device_train_batch_size=4, max_steps=4,
                                          save_strategy="no", report_to=[], disable_tqdm=True)  # fmt: skip
    transformers.Trainer(model, args, train_dataset=[{"input_ids": r, "labels": r} for r in rows]).train()
    model.generation_config.eos_token_id = None
    return timed_call(model, 8, 32)


def calls_table(rows: dict) -> Table:
    out = table("generate() as a user calls it", ("call", "seconds", "of it compiling", "programs compiled"))
    for name, row in rows.items():
        if name == "decode ms/token":
            figures = f"{row['plain']:.2f} / {row['eos']:.2f} / {row['min_new_tokens']:.2f}"
            out.add_row("decode ms/token: plain / EOS / + min_new_tokens", figures, f"x plain {row['ratio']:.2f}", "")
        elif "error" in row:
            out.add_row(name, "failed", row["error"][-120:], "")
        else:
            out.add_row(name, f"{row['seconds']:.2f}", f"{row['compile_s']:.2f}", str(row["programs"]))
    return out


# ---- diffusers -----------------------------------------------------------------------------
def sd_configs(width: int, size: int) -> dict:
    return {
        "text_encoder": dict(
            vocab_size=4096, hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            max_position_embeddings=77, bos_token_id=4094, eos_token_id=4095, pad_token_id=4095,
        ),
        "unet": dict(
            in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(width, 2 * width, 4 * width, 4 * width),
            down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
            cross_attention_dim=128, attention_head_dim=8, norm_num_groups=min(32, width), sample_size=size // 8,
        ),
        "vae": dict(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64, 64, 64),
            down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
            layers_per_block=1, norm_num_groups=32, sample_size=size,
        ),
        "scheduler": dict(
            beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1, clip_sample=False,
            set_alpha_to_one=False,
        ),
    }  # fmt: skip


def pipeline(opts, mode: str):
    from litert_torch.generative.diffusion import pipeline_from_configs

    pipe = pipeline_from_configs(**sd_configs(opts.unet_width, opts.sd_size))  # seeded: the same weights each time
    if mode != "cpu":
        pipe = pipe.to("tpu")
    if mode == "tpu-compiled":
        pipe.unet = torch.compile(pipe.unet, backend="tpu")
    return pipe


def image(pipe, opts):
    device = pipe.text_encoder.device
    ids = torch.randint(0, 4094, (1, 77), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        embeds, negative = pipe.text_encoder(ids)[0], pipe.text_encoder(torch.full_like(ids, 4095))[0]
    latents = torch.randn(1, 4, opts.sd_size // 8, opts.sd_size // 8, generator=torch.Generator().manual_seed(1))
    out = pipe(
        prompt_embeds=embeds, negative_prompt_embeds=negative, latents=latents.to(device),
        num_inference_steps=opts.sd_steps, guidance_scale=7.5, output_type="pt",
    )  # fmt: skip
    return out.images.cpu()


def bench_diffusers(opts) -> list[dict]:
    rows, reference = [], None
    for mode in opts.sd_modes.split(","):
        row = dict(mode=mode, size=opts.sd_size, steps=opts.sd_steps, unet_width=opts.unet_width)
        try:
            pipe = pipeline(opts, mode)
            row["unet_params"] = sum(p.numel() for p in pipe.unet.parameters())
            start = time.perf_counter()
            first = image(pipe, opts)
            row["first_call_s"] = time.perf_counter() - start
            times = []
            for _ in range(opts.repeats):
                start = time.perf_counter()
                image(pipe, opts)
                times.append(time.perf_counter() - start)
            row["s_per_image"] = statistics.median(times)
            if mode == "cpu":
                reference = (first, row["s_per_image"])
            elif reference is not None:
                row["x_cpu"] = row["s_per_image"] / reference[1]
                row["max_abs_diff_vs_cpu"] = float((first - reference[0]).abs().max())
        except Exception as error:
            row["error"] = f"{type(error).__name__}: {error}"[:300]
            traceback.print_exc()
        rows.append(row)
        console.print(row)
    return rows


def diffusers_table(rows: list[dict], opts) -> Table:
    title = f"diffusers: StableDiffusionPipeline {opts.sd_size}px, {opts.sd_steps} steps, UNet width {opts.unet_width}"
    table = Table(title=title)
    for column in ("mode", "first call s", "s / image", "x CPU", "max |image - CPU|"):
        table.add_column(column, justify="right")
    for r in rows:
        if "error" in r:
            table.add_row(r["mode"], r["error"][:60], "", "", "")
            continue
        x_cpu, diff = r.get("x_cpu"), r.get("max_abs_diff_vs_cpu")
        table.add_row(
            r["mode"], f"{r['first_call_s']:.1f}", f"{r['s_per_image']:.3f}", "" if x_cpu is None else f"{x_cpu:.2f}",
            "" if diff is None else f"{diff:.1e}",
        )  # fmt: skip
    return table


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="generate,diffusers")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU run in seconds)")
    for name, value in LLAMA_1B.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--caches", default="default,static", help="default, static, dynamic")
    p.add_argument("--loops", default="device", help="greedy loops: device, transformers (both: an A/B)")
    p.add_argument("--layer-regions", default="on", help="decoder layers traced once (on) or each (off); both: an A/B")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--trace", type=Path, help="profile one generate() of the first row into this folder")
    p.add_argument("--trace-top", type=int, default=40, help="host functions listed from the trace")
    p.add_argument("--profile", type=Path, help="cProfile the first row's first full call into this file")
    p.add_argument("--parts", action="store_true", help="time where the first row's decode step goes (no tracer)")
    p.add_argument("--hbm-gbps", type=float, default=HBM_GBPS_V5E)
    p.add_argument("--unet-width", type=int, default=128, help="UNet base channels (blocks: w, 2w, 4w, 4w)")
    p.add_argument("--sd-size", type=int, default=256, help="image pixels per side")
    p.add_argument("--sd-steps", type=int, default=20)
    p.add_argument("--sd-modes", default="cpu,tpu-eager,tpu-compiled")
    p.add_argument("--json", type=Path)
    opts = p.parse_args(argv)
    if opts.smoke:
        p.set_defaults(**SMOKE)
        opts = p.parse_args(argv)
    return opts


def main(argv=None) -> dict:
    opts = parse(argv)
    results = {"options": {k: str(v) for k, v in vars(opts).items()}, "device": torch.tpu.get_device_name()}
    sections = opts.sections.split(",")
    if "generate" in sections:
        results["generate"] = bench_generate(opts)
        console.print(generate_table(results["generate"], opts))
        for row in results["generate"]:
            if "trace" in row:
                console.print(trace_table(row["trace"]))
            if "parts" in row:
                title = f"one generate() per token, batch {row['batch']}, {row['cache']} cache: {row['parts']['wall']:.2f} ms"
                parts = [(label, f"{ms:.3f}") for label, ms in row["parts"].items() if label != "wall"]
                console.print(table(title, ("part", "ms/token"), parts))
    if "calls" in sections:
        results["calls"] = bench_calls(opts)
        console.print(calls_table(results["calls"]))
    for child, row in (("calls-child", first_call_row), ("after-train", after_train_row)):
        if child in sections:  # (a process of `calls`: one JSON line)
            print(json.dumps(row(opts)))
            return {}
    if "diffusers" in sections:
        results["diffusers"] = bench_diffusers(opts)
        console.print(diffusers_table(results["diffusers"], opts))
    if opts.json:
        write_json(opts.json, results)
    return results


if __name__ == "__main__":
    main()
