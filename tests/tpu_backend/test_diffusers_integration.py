"""diffusers models on the "tpu" device: a UNet2DModel and a DiT train as on CPU (eager
and under `torch.compile(backend="tpu")`), the trained UNet ships as a LiteRT model, and
a text-to-image StableDiffusionPipeline `.to("tpu")` paints CPU's image (eager, and with
its UNet compiled).

Models come from tiny configs with random weights (nothing downloads). The training step
is the usual denoising objective: noise added by a `DDPMScheduler` on CPU, the model
predicts it, mean squared error.

Tolerances: `tests/tpu_backend/parity.py` (losses, step-1 gradients and final parameters
within 1e-4 norm-relative). The key projections' biases of attention have gradients that
are zero in exact arithmetic (softmax ignores a per-query constant): both sides hold
float32 noise there, compared with parity's absolute floor. Images (float32 in [0, 1]):
within 1e-4 of CPU's (seen: 1e-6), 2e-3 on a chip (its reductions and transcendentals
differ in the last bits, carried through the denoising steps and the VAE).
"""

from __future__ import annotations

import string

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import tpu_backend  # noqa: F401  (registers the device)
from tests import chip
from tests.tpu_backend.parity import assert_runs_match, record_training

diffusers = pytest.importorskip("diffusers")
from diffusers.models.embeddings import LabelEmbedding  # noqa: E402

STEPS = 3
BATCH = 2


def tiny_unet():
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=8,
    )


def tiny_dit():
    torch.manual_seed(0)
    model = diffusers.DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=10,
    )
    # Label dropout (classifier-free guidance training) draws from torch's CPU generator on
    # one side and the device's on the other; switch it off so both runs see the same labels.
    for module in model.modules():
        if isinstance(module, LabelEmbedding):
            module.dropout_prob = 0.0
    return model


def denoising_batches(channels: int, classes: int | None = None, image_argument: str = "sample"):
    """(inputs, noise) per step: noisy images at random timesteps (and class labels)."""
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=1000)
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(STEPS):
        clean = torch.randn(BATCH, channels, 8, 8, generator=generator)
        noise = torch.randn(BATCH, channels, 8, 8, generator=generator)
        timesteps = torch.randint(0, 1000, (BATCH,), generator=generator)
        inputs = {image_argument: scheduler.add_noise(clean, noise, timesteps), "timestep": timesteps}
        if classes is not None:
            inputs["class_labels"] = torch.randint(0, classes, (BATCH,), generator=generator)
        batches.append((inputs, noise))
    return batches


def on(device, batches):
    return [({k: v.to(device) for k, v in inputs.items()}, noise.to(device)) for inputs, noise in batches]


def train(model, batches, *, compiled: bool):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def loss_of(inputs, noise):
        return F.mse_loss(model(**inputs).sample, noise)

    if compiled:
        loss_of = torch.compile(loss_of, backend="tpu")

    def step(inputs, noise):
        optimizer.zero_grad()
        loss = loss_of(inputs, noise)
        loss.backward()
        optimizer.step()
        return loss

    return record_training(model, step, batches)


MODELS = {
    "unet": (tiny_unet, lambda: denoising_batches(3)),
    "dit": (tiny_dit, lambda: denoising_batches(4, classes=10, image_argument="hidden_states")),
}


@pytest.mark.parametrize(
    "name,compiled",
    [
        # Each costs 20-40 s of CPU (the device compiles every op of a first step): slow.
        pytest.param("unet", False, marks=pytest.mark.slow),
        pytest.param("unet", True, marks=pytest.mark.slow),
        pytest.param("dit", False, marks=pytest.mark.slow),
        pytest.param("dit", True, marks=pytest.mark.slow),
    ],
)
def test_training_on_tpu_matches_cpu(name, compiled):
    build, make_batches = MODELS[name]
    batches = make_batches()
    want = train(build(), batches, compiled=False)
    got = train(build().to("tpu"), on("tpu", batches), compiled=compiled)
    assert_runs_match(got, want, f"{name} ({'torch.compile' if compiled else 'eager'}) on tpu")


class Denoiser(torch.nn.Module):
    """The UNet as a deployable function: (noisy image, timestep) -> predicted noise."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep):
        return self.unet(sample, timestep, return_dict=False)[0]


@pytest.mark.parametrize("device", ["cpu", pytest.param("tpu", marks=pytest.mark.slow)])
def test_trained_unet_converts_to_litert(device):
    import litert_torch
    from tests.helpers import compare_outputs

    unet = tiny_unet().to(device)
    train(unet, on(device, denoising_batches(3)), compiled=False)
    denoiser = Denoiser(unet).eval()
    sample = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    timestep = torch.tensor([250])

    edge = litert_torch.convert(denoiser, (sample, timestep))  # parameters are copied to CPU by the exporter
    denoiser.cpu()
    noisier = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    for x, t in ((sample, timestep), (noisier, torch.tensor([999]))):
        with torch.no_grad():
            want = denoiser(x, t).numpy()
        problems = compare_outputs([edge(x, t)], [want], rtol=1e-4, atol=1e-5)
        assert not problems, problems


def tiny_text_to_image_pipeline():
    """StableDiffusionPipeline from tiny configs: CLIP text encoder and tokenizer (letters
    as its vocabulary, built in code: nothing downloads), a cross-attention UNet, a VAE, DDIM."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for letter in string.ascii_lowercase:
        vocab[letter] = len(vocab)
        vocab[letter + "</w>"] = len(vocab)
    torch.manual_seed(0)
    pipe = diffusers.StableDiffusionPipeline(
        tokenizer=CLIPTokenizer(vocab=vocab, merges=[], model_max_length=16),
        text_encoder=CLIPTextModel(
            CLIPTextConfig(
                vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1,
            )
        ),
        unet=diffusers.UNet2DConditionModel(
            in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=16, attention_head_dim=4, norm_num_groups=4, sample_size=8,
        ),
        vae=diffusers.AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            layers_per_block=1, norm_num_groups=4, sample_size=16,
        ),
        scheduler=diffusers.DDIMScheduler(
            beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1, clip_sample=False,
            set_alpha_to_one=False,
        ),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


def paint(pipe, **noise) -> np.ndarray:
    """One 16x16 image: two DDIM steps with classifier-free guidance, from `latents=` or a `generator=`."""
    out = pipe("a red cat", num_inference_steps=2, guidance_scale=7.5, output_type="np", **noise)
    return out.images[0]


# eager costs ~40 s of CPU (every op of three models compiles once); compiling the UNet adds ~30 s: slow
@pytest.mark.parametrize("unet", ["eager", pytest.param("compiled", marks=pytest.mark.slow)])
def test_text_to_image_pipeline_on_tpu_paints_cpus_image(unet):
    # the initial noise is drawn on CPU and passed in: both pipelines start from the same latents
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    cpu_pipe = tiny_text_to_image_pipeline()
    want = paint(cpu_pipe, latents=latents)
    pipe = tiny_text_to_image_pipeline().to("tpu")
    assert pipe.device.type == "tpu"
    if unet == "compiled":
        pipe.unet = torch.compile(pipe.unet, backend="tpu")
    got = paint(pipe, latents=latents.to("tpu"))
    assert got.shape == want.shape == (16, 16, 3) and want.std() > 0.01  # a picture, not a flat field
    tolerance = chip.tolerance("summation_order", cpu=1e-4, tpu=2e-3)
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance, err_msg=f"pipeline on tpu, UNet {unet}")
    # a CPU generator, as users seed diffusers: the latents are drawn on CPU and moved to the device
    np.testing.assert_allclose(
        paint(pipe, generator=torch.Generator().manual_seed(4)),
        paint(cpu_pipe, generator=torch.Generator().manual_seed(4)),
        rtol=0,
        atol=tolerance,
        err_msg=f"pipeline on tpu with a CPU generator, UNet {unet}",
    )
