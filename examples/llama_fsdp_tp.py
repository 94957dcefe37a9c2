"""TorchTitan-shaped training on "tpu": a Llama-style model, FSDP2 + tensor parallel on a
2 x 2 mesh of 4 processes, torch.compile, activation checkpointing, DCP checkpoints, then
a LiteRT export of the gathered weights.

    python -m torch.distributed.run --nproc_per_node 4 examples/llama_fsdp_tp.py
    python -m torch.distributed.run --nproc_per_node 4 examples/llama_fsdp_tp.py --steps 20 --dp 2 --tp 2 \\
        --checkpoint /tmp/llama_ckpt --out /tmp/llama.tflite

Every process drives one chip (one JAX CPU device here) through the "tpu"
torch.distributed backend (`tpu_backend/distributed/process_group.py`); the script is
plain PyTorch: `init_device_mesh("tpu", (dp, tp))`, `parallelize_module` with
TorchTitan's sequence-parallel plan, `fully_shard` per block, `checkpoint_wrapper`,
`torch.compile(backend="tpu")` per block, `torch.distributed.checkpoint` for the
sharded state. At the end rank 0 gathers the full weights (`get_model_state_dict` with
`full_state_dict=True`), loads them into an unsharded copy on CPU and converts it with
`litert_torch.convert`; the LiteRT logits are compared with PyTorch's.

`Llama`, `tensor_parallel_plan` and `parallelize` are imported by the tests
(`tests/tpu_backend/distributed/torch_parallel.py`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))


@dataclass
class LlamaConfig:
    vocab: int = 64
    dim: int = 32
    layers: int = 2
    heads: int = 4
    hidden: int = 64
    seq: int = 8
    eps: float = 1e-5
    kv_heads: int | None = None  # grouped-query attention: fewer key/value heads (None: = heads)

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads or self.heads


# Shapes for `python -m tpu_backend.aot examples/llama_fsdp_tp.py --size ...` (weights never exist).
PRESETS = {
    "tiny": LlamaConfig(),
    "small": LlamaConfig(vocab=512, dim=256, layers=2, heads=4, hidden=512, seq=128),
    # DESIGN.md's 0.95B JAX reference shape (untied head, vocabulary 32000)
    "1b": LlamaConfig(vocab=32000, dim=2048, layers=16, heads=16, hidden=5632, seq=2048),
    "350m": LlamaConfig(vocab=32000, dim=1024, layers=24, heads=16, hidden=2816, seq=2048),
    # Llama-3-8B's shape
    "8b": LlamaConfig(vocab=128256, dim=4096, layers=32, heads=32, kv_heads=8, hidden=14336, seq=8192, eps=1e-5),
}


def rotary_tables(config: LlamaConfig) -> torch.Tensor:
    """(seq, head_dim / 2, 2) cos/sin of the rotary angles (real arithmetic: export-friendly)."""
    head_dim = config.dim // config.heads
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(config.seq).float(), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rotary(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    cos, sin = tables[..., 0][None, :, None, :], tables[..., 1][None, :, None, :]
    real, imag = pairs[..., 0], pairs[..., 1]
    return torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.head_dim = config.dim // config.heads
        self.grouped = config.key_value_heads != config.heads
        self.wq = nn.Linear(config.dim, config.dim, bias=False)
        self.wk = nn.Linear(config.dim, config.key_value_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.key_value_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)

    def forward(self, x, rotary):
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallel each rank holds heads / tp of them
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.grouped:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden, bias=False)
        self.w2 = nn.Linear(config.hidden, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, rotary):
        x = x + self.attention(self.attention_norm(x), rotary)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim, config.eps)
        self.output = nn.Linear(config.dim, config.vocab, bias=False)
        self.register_buffer("rotary", rotary_tables(config), persistent=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.rotary)
        return self.output(self.norm(x))


def batches(config: LlamaConfig, steps: int, batch: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same random token batches in every process: (inputs, next-token targets)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, config.vocab, (batch, config.seq + 1), generator=g)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# --------------------------------------------------------------------- parallelism (plain PyTorch)


def tensor_parallel_plan(model: Llama, tp_mesh, sequence_parallel: bool = True) -> None:
    """TorchTitan's Llama plan: attention/FFN column- then row-wise; with sequence parallel
    the norms and the residual stream are split over the sequence between them."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    between = Shard(1) if sequence_parallel else Replicate()
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
            "output": ColwiseParallel(input_layouts=between, output_layouts=Replicate(), use_local_output=True),
            **({"norm": SequenceParallel()} if sequence_parallel else {}),
        },
    )
    for block in model.layers:
        plan = {
            "attention": PrepareModuleInput(input_layouts=(between, None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=between),
            "feed_forward": PrepareModuleInput(input_layouts=(between,), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=between),
            "feed_forward.w3": ColwiseParallel(),
        }
        if sequence_parallel:
            plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
        parallelize_module(block, tp_mesh, plan)


def parallelize(
    model: Llama,
    mesh,
    *,
    tp: bool,
    fsdp: bool,
    checkpointing: bool = False,
    compile: bool = False,
    sequence_parallel: bool = True,
) -> Llama:
    """TorchTitan's order: tensor parallel, activation checkpointing, compile, FSDP2.
    `mesh` has axes ("dp", "tp") (either may be absent)."""
    from torch.distributed.fsdp import fully_shard

    if tp:
        tensor_parallel_plan(model, mesh["tp"], sequence_parallel)
    for i, block in enumerate(model.layers):
        if checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            block = checkpoint_wrapper(block, preserve_rng_state=False)
        if compile:
            block = torch.compile(block, backend="tpu", fullgraph=True)
        model.layers[i] = block
    if fsdp:
        dp_mesh = mesh["dp"]
        for block in model.layers:
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model


# --------------------------------------------------------------------- planning for a pod (tpu_backend.aot)


def device_tensor_parallel_plan() -> dict:
    """The plan above in the single-controller API's terms (`tpu_backend.distributed`):
    attention and FFN column- then row-wise, the embedding split over the vocabulary and
    the head over its outputs (no sequence parallel: XLA places the activations)."""
    from tpu_backend.distributed import ColwiseParallel, RowwiseParallel

    return {
        "tok_embeddings": RowwiseParallel(),
        "output": ColwiseParallel(),
        "layers.*.attention.w[qkv]": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(),
        "layers.*.feed_forward.w[13]": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(),
    }


def aot_step(size: str = "tiny", batch: int = 8, seq: int | None = None, dtype: str = "bfloat16") -> dict:
    """This example's training step for `python -m tpu_backend.aot` (and
    `tpu_backend.aot.compile_step(**aot_step(...), topology=..., mesh=...)`): the model on
    the meta device (no weights), a global batch of token ids, the loss, the TP plan."""
    import dataclasses

    if size not in PRESETS:
        raise ValueError(f"--size {size!r}: choose one of {', '.join(PRESETS)}")
    config = dataclasses.replace(PRESETS[size], seq=seq or PRESETS[size].seq)
    with torch.device("meta"):
        model = Llama(config).to(getattr(torch, dtype))
    tokens = ((batch, config.seq), torch.long)
    return {
        "model": model,
        "inputs": [tokens],
        "targets": [tokens],
        "loss": loss_fn,
        "tensor_parallel": device_tensor_parallel_plan(),
    }


# --------------------------------------------------------------------- the training run


def latest_checkpoint(folder: str | None) -> tuple[str | None, int]:
    """The newest `step-K` DCP checkpoint in `folder` and K (None, 0 when there is none)."""
    if not folder or not os.path.isdir(folder):
        return None, 0
    steps = [int(name[5:]) for name in os.listdir(folder) if name.startswith("step-") and name[5:].isdigit()]
    steps = [k for k in steps if os.path.exists(os.path.join(folder, f"step-{k}", ".metadata"))]
    if not steps:
        return None, 0
    return os.path.join(folder, f"step-{max(steps)}"), max(steps)


def export_gathered(model: nn.Module, config: LlamaConfig, out: str, rank: int) -> dict | None:
    """Gather the full weights (a collective: every rank calls it), load them into an
    unsharded CPU model on rank 0, convert it to LiteRT and compare logits."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    import litert_torch

    plain = Llama(config)
    plain.load_state_dict(full)  # FQNs come back without the compile/checkpoint wrappers' prefixes
    plain.eval()
    tokens = torch.randint(0, config.vocab, (1, config.seq), generator=torch.Generator().manual_seed(1))
    edge = litert_torch.convert(plain, (tokens,))
    path = edge.export(out)
    with torch.no_grad():
        want = plain(tokens).numpy()
    got = edge(tokens)
    return {"path": path, "bytes": os.path.getsize(path), "max_abs_error": float(abs(got - want).max())}


def main(argv=None) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    import tpu_backend  # noqa: F401  (registers the device and its torch.distributed backend)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, default=2, help="FSDP2 degree (mesh axis 'dp')")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (mesh axis 'tp')")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8, help="global batch (split over 'dp')")
    parser.add_argument("--checkpoint", default=None, help="DCP folder: resume from its newest step-K, save there")
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--out", default=os.path.join("/tmp", "llama_fsdp_tp.tflite"))
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args(argv)

    dist.init_process_group("tpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.dp * args.tp != world:
        raise SystemExit(f"--dp {args.dp} x --tp {args.tp} = {args.dp * args.tp} ranks, but the launch has {world}")
    mesh = init_device_mesh("tpu", (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    config = LlamaConfig()
    torch.manual_seed(0)
    model = parallelize(
        Llama(config).to("tpu"), mesh, tp=True, fsdp=True, checkpointing=True, compile=not args.no_compile
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    resume, start = latest_checkpoint(args.checkpoint)
    if resume:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=resume)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    data = batches(config, args.steps, args.batch)
    rows = args.batch // args.dp
    dp_rank = mesh["dp"].get_local_rank()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(
        f"{world} processes, mesh dp={args.dp} x tp={args.tp}; resuming from {resume}"
        if resume
        else f"{world} processes, mesh dp={args.dp} x tp={args.tp}"
    )
    for step in range(start, args.steps):
        inputs, targets = (t[dp_rank * rows : (dp_rank + 1) * rows].to("tpu") for t in data[step])
        began = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        value = loss.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
        say(f"step {step + 1}: loss {value.item():.5f} ({time.perf_counter() - began:.2f} s)", flush=True)
        if args.checkpoint and (step + 1) % args.save_every == 0:
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save(
                {"model": model_state, "optim": optim_state},
                checkpoint_id=os.path.join(args.checkpoint, f"step-{step + 1}"),
            )
            say(f"saved {args.checkpoint}/step-{step + 1}")
    exported = export_gathered(model, config, args.out, rank)
    if exported:
        say(
            f"LiteRT: {exported['path']} ({exported['bytes']:,} bytes), max |logits - PyTorch| = {exported['max_abs_error']:.2e}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
