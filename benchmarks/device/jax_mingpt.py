"""The minGPT training step written directly in JAX: the ceiling for the "tpu" device.

    python -m benchmarks.device.jax_mingpt                  # median step time, minGPT size, torch's initial weights
    python -m benchmarks.device.jax_mingpt --check 3        # also: first 3 losses against PyTorch CPU eager
    python -m benchmarks.device.jax_mingpt --model transformer --steps 20 --json -

The model is `TinyGPT` of `benchmarks/models.py` (the config and the batch come from
there: minGPT is 6 layers, 384 wide, 6 heads, context 128, batch 8, vocabulary 512),
written as plain JAX functions, as a JAX expert writes them: pre-norm blocks with causal
multi-head attention laid out like `nn.MultiheadAttention` (one packed input projection),
exact GELU, next-token cross-entropy, with PyTorch's hand-derived backward formulas where
ATen has them (`jax.custom_vjp`: layer norm, softmax, GELU, cross-entropy). A step is `jax.value_and_grad` of the loss and a hand-written AdamW with
PyTorch's formula and `make_optimizer("adamw")`'s settings (decay on every parameter),
all inside one `jax.jit` whose parameter and state buffers are donated (updated in place,
as PyTorch's optimizer does). The weights are the torch model's from the same seed
(`params_from_torch`), and so is the batch, so the losses are those of every mode of
`benchmarks/device/backend_bench.py`, which imports `JaxTrainer` from here.

Nothing here goes through PyTorch's dispatcher: it is what the device could reach if its
overhead were zero. The report also says whether `torchax` (PyPI, the JAX-backed tensor
library) can run here; it cannot with torch 2.13.0 (see `TORCHAX_REASON`).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import write_json
from benchmarks.models import MODEL_CASES, GPTConfig, TinyGPT

Params = dict[str, Any]  # a pytree: {"tokens": ..., "blocks": [{...}, ...], ...}

LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default

# Checked with `pip install torchax==0.0.13 torch==2.13.0 jax==0.10.2` in a separate venv
# (torchax is not one of our dependencies): `import torchax` fails at its module-level
# autocast table (torchax/amp.py line 118, `torch.ops.aten.prod.dim_Dimname`).
TORCHAX_REASON = (
    "torchax 0.0.13 fails to import on torch 2.13.0: AttributeError: "
    "The underlying op of 'aten.prod' has no overload name 'dim_Dimname' (torchax/amp.py:118)"
)


def torchax_status() -> str:
    """Whether torchax can run in this environment (it is not one of our dependencies)."""
    try:
        import torchax  # noqa: F401
    except ModuleNotFoundError:
        return f"torchax: cannot run ({TORCHAX_REASON}; not installed in this environment)"
    except Exception as error:  # noqa: BLE001 - any import failure is the answer
        return f"torchax: cannot run ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
    return "torchax: importable (not benchmarked: it has no torch.compile backend to compare)"


# ----------------------------------------------------------------------------- weights


def params_from_torch(model: TinyGPT) -> Params:
    """The torch model's weights as a JAX pytree (same layout, float32 copies)."""

    def get(name: str) -> jax.Array:
        return jnp.asarray(state[name].detach().cpu().numpy())

    state = model.state_dict()
    blocks = []
    for i in range(len(model.blocks)):
        prefix = f"blocks.{i}."
        blocks.append(
            {
                "norm1": {"weight": get(prefix + "norm1.weight"), "bias": get(prefix + "norm1.bias")},
                "qkv": {
                    "weight": get(prefix + "attention.in_proj_weight"),
                    "bias": get(prefix + "attention.in_proj_bias"),
                },
                "proj": {
                    "weight": get(prefix + "attention.out_proj.weight"),
                    "bias": get(prefix + "attention.out_proj.bias"),
                },
                "norm2": {"weight": get(prefix + "norm2.weight"), "bias": get(prefix + "norm2.bias")},
                "fc": {"weight": get(prefix + "mlp.0.weight"), "bias": get(prefix + "mlp.0.bias")},
                "out": {"weight": get(prefix + "mlp.2.weight"), "bias": get(prefix + "mlp.2.bias")},
            }
        )
    return {
        "tokens": get("tokens.weight"),
        "positions": get("positions.weight"),
        "blocks": blocks,
        "norm": {"weight": get("norm.weight"), "bias": get("norm.bias")},
        "head": {"weight": get("head.weight"), "bias": get("head.bias")},
    }


def parameter_count(params: Params) -> int:
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(params))


# ----------------------------------------------------------------------------- the model
#
# Written as a JAX expert writes a training step for XLA: where PyTorch's own kernels have
# a hand-derived backward (layer norm, softmax, GELU, cross-entropy), so does this step
# (`jax.custom_vjp` with the same formula), so that the backward saves what PyTorch saves
# and recomputes what it recomputes. Left to autodiff, these four saved their forward
# intermediates instead (x - mean and its normalised copy, the softmax's broadcast
# normaliser, erf of the GELU input, the log-probabilities): 12% more CPU time per minGPT
# step than with the hand-written backward (measured interleaved, process CPU time).
# Matmuls are 2-D (flattened leading dims) or 3-D with one batch dim (batch * heads), the
# forms XLA's CPU backend runs fastest and PyTorch's `linear`/`bmm` use.


def linear(x: jax.Array, p: Params) -> jax.Array:
    """nn.Linear: weight is (out, in), one 2-D matmul over the flattened leading dims."""
    leading = x.shape[:-1]
    out = x.reshape(-1, x.shape[-1]) @ p["weight"].T + p["bias"]
    return out.reshape(*leading, out.shape[-1])


@jax.custom_vjp
def _layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
    return _layer_norm_forward(x, weight, bias)[0]


def _layer_norm_forward(x, weight, bias):
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    rstd = jax.lax.rsqrt(jnp.square(centred).mean(-1, keepdims=True) + LAYER_NORM_EPS)
    return centred * rstd * weight + bias, (x, mean, rstd, weight)


def _layer_norm_backward(saved, grad):
    """ATen's native_layer_norm_backward: from the input, its mean and 1/std only."""
    x, mean, rstd, weight = saved
    normed = (x - mean) * rstd
    rows = tuple(range(x.ndim - 1))
    grad_normed = grad * weight
    grad_x = rstd * (
        grad_normed - grad_normed.mean(-1, keepdims=True) - normed * (grad_normed * normed).mean(-1, keepdims=True)
    )
    return grad_x, (grad * normed).sum(rows), grad.sum(rows)


_layer_norm.defvjp(_layer_norm_forward, _layer_norm_backward)


def layer_norm(x: jax.Array, p: Params) -> jax.Array:
    return _layer_norm(x, p["weight"], p["bias"])


@jax.custom_vjp
def causal_softmax(scores: jax.Array) -> jax.Array:
    """softmax over the last axis of (..., T, T) scores, future positions masked out."""
    return _causal_softmax_forward(scores)[0]


def _causal_softmax_forward(scores):
    length = scores.shape[-1]
    future = jnp.triu(jnp.ones((length, length), dtype=bool), 1)
    scores = jnp.where(future, -jnp.inf, scores)
    shifted = jnp.exp(scores - scores.max(-1, keepdims=True))
    probs = shifted / shifted.sum(-1, keepdims=True)
    return probs, probs


def _causal_softmax_backward(probs, grad):
    """ATen's _softmax_backward_data, from the probabilities (masked entries are 0)."""
    return (probs * (grad - (grad * probs).sum(-1, keepdims=True)),)


causal_softmax.defvjp(_causal_softmax_forward, _causal_softmax_backward)


def causal_self_attention(x: jax.Array, block: Params, heads: int) -> jax.Array:
    """nn.MultiheadAttention(q=k=v=x) with a causal mask, no dropout: heads as one batch
    dim of 3-D matmuls, (batch * heads, T, head_dim), as PyTorch's attention does."""
    batch, length, width = x.shape
    head_dim = width // heads
    qkv = linear(x, block["qkv"]).reshape(batch, length, 3, heads, head_dim)
    q, k, v = qkv.transpose(2, 0, 3, 1, 4).reshape(3, batch * heads, length, head_dim)
    scores = jnp.einsum("bld,bsd->bls", q, k) * (1.0 / math.sqrt(head_dim))
    mixed = jnp.einsum("bls,bsd->bld", causal_softmax(scores), v)
    mixed = mixed.reshape(batch, heads, length, head_dim).transpose(0, 2, 1, 3).reshape(batch, length, width)
    return linear(mixed, block["proj"])


_SQRT_HALF = float(np.sqrt(0.5))
_PDF_SCALE = float(1.0 / np.sqrt(2.0 * np.pi))


@jax.custom_vjp
def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU in PyTorch's formula, 0.5 x (1 + erf(x / sqrt 2)). Not
    `jax.nn.gelu(approximate=False)`: that one is written with `erfc`, which XLA's CPU
    backend expands into ~60 ops per element (its `erf` is one short polynomial)."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * _SQRT_HALF))


def _gelu_forward(x):
    return gelu(x), x


def _gelu_backward(x, grad):
    """ATen's gelu_backward: from the input alone, cdf(x) + x pdf(x)."""
    cdf = 0.5 * (1.0 + jax.lax.erf(x * _SQRT_HALF))
    return (grad * (cdf + x * jnp.exp(-0.5 * x * x) * _PDF_SCALE),)


gelu.defvjp(_gelu_forward, _gelu_backward)


def transformer_block(x: jax.Array, block: Params, heads: int) -> jax.Array:
    x = x + causal_self_attention(layer_norm(x, block["norm1"]), block, heads)
    hidden = gelu(linear(layer_norm(x, block["norm2"]), block["fc"]))
    return x + linear(hidden, block["out"])


def forward(params: Params, tokens: jax.Array, heads: int) -> jax.Array:
    """Logits (B, T, vocab) for token ids (B, T)."""
    length = tokens.shape[1]
    x = params["tokens"][tokens] + params["positions"][:length]
    for block in params["blocks"]:
        x = transformer_block(x, block, heads)
    return linear(layer_norm(x, params["norm"]), params["head"])


@jax.custom_vjp
def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy of (N, vocab) logits against (N,) class ids (F.cross_entropy)."""
    return _cross_entropy_forward(logits, targets)[0]


def _cross_entropy_forward(logits, targets):
    logsumexp = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    return (logsumexp - picked).mean(), (logits, logsumexp, targets)


def _cross_entropy_backward(saved, grad):
    """softmax(logits) - one_hot(target), scaled: ATen's log_softmax + nll_loss backward
    in one expression."""
    logits, logsumexp, targets = saved
    one_hot = targets[:, None] == jnp.arange(logits.shape[-1])
    scale = grad / logits.shape[0]
    return (jnp.exp(logits - logsumexp[:, None]) - one_hot) * scale, None


cross_entropy.defvjp(_cross_entropy_forward, _cross_entropy_backward)


def sequence_loss(params: Params, tokens: jax.Array, targets: jax.Array, heads: int) -> jax.Array:
    """Mean next-token cross-entropy (F.cross_entropy over every position)."""
    logits = forward(params, tokens, heads)
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ----------------------------------------------------------------------------- AdamW


@dataclass(frozen=True)
class AdamW:
    """torch.optim.AdamW's update (non-amsgrad), with `make_optimizer("adamw")`'s settings."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01

    def init(self, params: Params) -> dict:
        zeros = lambda: jax.tree_util.tree_map(jnp.zeros_like, params)  # noqa: E731
        return {"step": jnp.zeros((), jnp.float32), "exp_avg": zeros(), "exp_avg_sq": zeros()}

    def update(self, params: Params, grads: Params, state: dict) -> tuple[Params, dict]:
        step = state["step"] + 1
        exp_avg = jax.tree_util.tree_map(lambda m, g: self.beta1 * m + (1 - self.beta1) * g, state["exp_avg"], grads)
        exp_avg_sq = jax.tree_util.tree_map(
            lambda v, g: self.beta2 * v + (1 - self.beta2) * g * g, state["exp_avg_sq"], grads
        )
        step_size = self.lr / (1 - self.beta1**step)
        bias_correction2_sqrt = jnp.sqrt(1 - self.beta2**step)

        def new_param(p, m, v):
            decayed = p * (1 - self.lr * self.weight_decay)
            return decayed - step_size * m / (jnp.sqrt(v) / bias_correction2_sqrt + self.eps)

        params = jax.tree_util.tree_map(new_param, params, exp_avg, exp_avg_sq)
        return params, {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


# ----------------------------------------------------------------------------- training


def step_flops(config: GPTConfig, batch: int) -> int:
    """Model FLOPs of one training step (forward + backward), the usual estimate:
    6 * N * tokens for the weight matmuls (N: parameters outside the embedding tables)
    plus 12 * layers * width * context per token for attention scores and mixing."""
    width, layers = config.width, config.layers
    per_block = 4 * width * width + 4 * width + 8 * width * width + 5 * width + 4 * width  # attn, mlp, 2 norms
    n = layers * per_block + 2 * width + width * config.vocab + config.vocab
    tokens = batch * config.context
    return 6 * n * tokens + 12 * layers * width * config.context * tokens


class JaxTrainer:
    """One jitted AdamW training step of TinyGPT in plain JAX, on fixed weights and batch."""

    def __init__(self, model_name: str = "mingpt", seed: int = 0, optimizer: AdamW = AdamW(), case=None):
        case = case or MODEL_CASES[model_name]  # `case`: e.g. another batch size (backend_bench --batch)
        import torch

        torch.manual_seed(seed)
        model = case.build()
        if not isinstance(model, TinyGPT):
            raise ValueError(f"JaxTrainer runs the GPT models ('transformer', 'mingpt'), not {model_name!r}")
        self.config: GPTConfig = model.config
        self.params = params_from_torch(model)
        self.optimizer = optimizer
        self.state = optimizer.init(self.params)
        inputs, target = case.batch(torch.Generator().manual_seed(seed))
        self.batch_size = inputs.shape[0]
        self.tokens = jnp.asarray(inputs.numpy())
        self.targets = jnp.asarray(target.numpy())
        heads = self.config.heads

        def train_step(params, state, tokens, targets):
            loss, grads = jax.value_and_grad(sequence_loss)(params, tokens, targets, heads)
            params, state = optimizer.update(params, grads, state)
            return params, state, loss

        self._step = jax.jit(train_step, donate_argnums=(0, 1))

    def enqueue_step(self) -> jax.Array:
        """One training step, enqueued; returns the loss (not waited for)."""
        self.params, self.state, loss = self._step(self.params, self.state, self.tokens, self.targets)
        return loss

    def step(self) -> jax.Array:
        """One training step; returns the loss (computed, i.e. synchronised)."""
        return self.enqueue_step().block_until_ready()

    @property
    def flops_per_step(self) -> int:
        return step_flops(self.config, self.batch_size)


def bench(model_name: str, steps: int, warmup: int) -> dict:
    trainer = JaxTrainer(model_name)
    times = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        loss = trainer.step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times[warmup:])
    return {
        "model": model_name,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "parameters": parameter_count(trainer.params),
        "flops_per_step": trainer.flops_per_step,
        "median_s": median,
        "first_step_s": times[0],
        "steps": times[warmup:],
        "final_loss": float(loss),
        "gflops_per_s": trainer.flops_per_step / median / 1e9,
        "torchax": torchax_status(),
    }


def check_against_torch(model_name: str, steps: int) -> list[tuple[float, float]]:
    """(jax loss, torch CPU eager loss) for the first `steps` steps from the same weights."""
    import torch

    from benchmarks.models import make_optimizer, train_step

    trainer = JaxTrainer(model_name)
    case = MODEL_CASES[model_name]
    torch.manual_seed(0)
    model = case.build()
    optimizer = make_optimizer("adamw", model.parameters())
    inputs, target = case.batch(torch.Generator().manual_seed(0))
    return [(float(trainer.step()), train_step(model, optimizer, case, inputs, target).item()) for _ in range(steps)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mingpt", choices=["transformer", "mingpt"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (the jit compile is in the first)")
    parser.add_argument("--check", type=int, default=0, metavar="N", help="compare the first N losses with PyTorch CPU")
    parser.add_argument("--json", metavar="FILE", help="write results as JSON to FILE ('-' for stdout)")
    args = parser.parse_args(argv)

    ok = True
    if args.check:
        for step, (jax_loss, torch_loss) in enumerate(check_against_torch(args.model, args.check), 1):
            relative = abs(jax_loss - torch_loss) / abs(torch_loss)
            ok &= relative <= 1e-4
            print(f"step {step}: jax {jax_loss:.6f}  torch cpu {torch_loss:.6f}  relative {relative:.1e}")
    result = bench(args.model, args.steps, args.warmup)
    print(
        f"{args.model} in plain JAX ({result['backend']}): {result['median_s'] * 1e3:.1f} ms/step median, "
        f"first step {result['first_step_s']:.2f} s, {result['parameters'] / 1e6:.2f} M parameters, "
        f"{result['flops_per_step'] / 1e9:.1f} GFLOP/step = {result['gflops_per_s']:.1f} GFLOP/s, "
        f"final loss {result['final_loss']:.4f}"
    )
    print(result["torchax"])
    if args.json:
        write_json(args.json, result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
