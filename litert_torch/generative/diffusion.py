"""Export a Stable-Diffusion-shaped diffusers pipeline as one LiteRT file of three
signatures sharing nothing but the file, and run it with a NumPy scheduler.

    edge = export_diffusion(pipe, height=64, width=64)        # verified in LiteRT before it returns
    edge.export("sd.tflite")
    run = LiteRTDiffusionPipeline(edge, pipe.scheduler)       # or litert_torch.load("sd.tflite")
    image = run(prompt_ids, negative_prompt_ids=empty_ids, num_inference_steps=20,
                guidance_scale=7.5, latents=noise)            # float32 [H, W, 3] in [0, 1]

Signatures (float32 unless said; L = the text encoder's sequence length, D its width,
C the latent channels, h = H / vae_scale_factor):

    encode_text   (input_ids int32[1, L])                          -> text_embeddings [1, L, D]
    denoise       (latents [1, C, h, w], timestep [1],
                   text_embeddings [2, L, D] (negative, then prompt), guidance_scale [1])
                                                                    -> noise_pred [1, C, h, w]
    decode_latents(latents [1, C, h, w])                           -> image [1, H, W, 3] in [0, 1]

Each runs the component's own forward (transformers' CLIP text model, diffusers'
UNet2DConditionModel and AutoencoderKL); around it only what StableDiffusionPipeline
does itself: `encode_text` returns the last hidden state; `denoise` runs the UNet on the
latents twice in one batch of 2 against the negative and the prompt embeddings and
returns classifier-free guidance, uncond + guidance_scale * (cond - uncond) (one call per
step; guidance_scale is an input, so one file serves every scale); `decode_latents`
divides by `vae.config.scaling_factor`, decodes and maps [-1, 1] to [0, 1] as the
pipeline's image processor does, channels last. The scheduler (scale_model_input, step)
runs in NumPy on the host (`schedulers.py`). A UNet with a guidance-scale embedding
(`time_cond_proj_dim`, LCM-distilled) has no classifier-free guidance in diffusers: its
`denoise` takes text_embeddings [1, L, D] (the prompt alone) and feeds the pipeline's
embedding of guidance_scale - 1 as `timestep_cond`.

Exact or refused: features the signatures would not reproduce are refused by name before
export (`check_supported`: SDXL's added conditions, class labels, inpainting UNets,
mismatched widths...), and after conversion every signature is
run in the LiteRT interpreter on seeded random inputs and compared with the component's
own forward in PyTorch: above `tolerance` (1e-4, max relative) the export is refused
with each signature's error (`DiffusionExportError`). With a `quant_config` the errors
are measured and kept (`edge.verification`) but not refused: quantization trades them.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from converter.pipeline import cpu_view
from litert_torch.edge_model import EdgeModel
from litert_torch.generative.schedulers import NumpyScheduler, numpy_scheduler
from litert_torch.signatures import signature

SIGNATURES = ("encode_text", "denoise", "decode_latents")
TOLERANCE = 1e-4


class DiffusionExportError(ValueError):
    """The pipeline has a feature the export would not reproduce, or a converted
    signature differs from the component's own forward."""


# ---- the signatures' modules ------------------------------------------------------------
class TextEncoder(nn.Module):
    """`encode_text`: the text encoder's last hidden state, as the pipeline reads it."""

    def __init__(self, text_encoder: nn.Module):
        super().__init__()
        self.text_encoder = text_encoder

    def forward(self, input_ids):
        return self.text_encoder(input_ids)[0]


class GuidedDenoiser(nn.Module):
    """`denoise`: the UNet on [latents, latents] against [negative, prompt] embeddings,
    combined by classifier-free guidance."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, latents, timestep, text_embeddings, guidance_scale):
        noise = self.unet(torch.cat([latents, latents]), timestep, text_embeddings, return_dict=False)[0]
        uncond, cond = noise.chunk(2)
        return uncond + guidance_scale * (cond - uncond)


class GuidanceEmbeddedDenoiser(nn.Module):
    """`denoise` for a UNet with a guidance-scale embedding (`time_cond_proj_dim`, as in
    LCM-distilled models): one batch against the prompt's embeddings, the scale entering
    through `timestep_cond` (StableDiffusionPipeline's own embedding of guidance_scale - 1),
    no classifier-free guidance."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet
        self.dim = int(unet.config.time_cond_proj_dim)

    def forward(self, latents, timestep, text_embeddings, guidance_scale):
        cond = guidance_scale_embedding(guidance_scale - 1, self.dim)
        return self.unet(latents, timestep, text_embeddings, timestep_cond=cond, return_dict=False)[0]


def guidance_scale_embedding(w: torch.Tensor, dim: int) -> torch.Tensor:
    """StableDiffusionPipeline's sinusoidal embedding of w = guidance_scale - 1 (diffusers' own method)."""
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.get_guidance_scale_embedding(None, w, embedding_dim=dim)  # (uses no state)


def embeds_guidance(unet: nn.Module) -> bool:
    """Whether the UNet takes the guidance scale as an embedding (then no classifier-free guidance)."""
    return getattr(unet.config, "time_cond_proj_dim", None) is not None


def _denoiser(unet: nn.Module) -> nn.Module:
    return GuidanceEmbeddedDenoiser(unet) if embeds_guidance(unet) else GuidedDenoiser(unet)


class LatentDecoder(nn.Module):
    """`decode_latents`: the VAE decoder from scaled latents to a [0, 1] image, channels last."""

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.vae = vae
        self.scaling_factor = float(vae.config.scaling_factor)

    def forward(self, latents):
        image = self.vae.decode(latents / self.scaling_factor, return_dict=False)[0]
        return (image * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)


# ---- pipelines from configs ---------------------------------------------------------------
# A Stable-Diffusion-1.x-shaped pipeline, small enough for tests (about 1.7 M parameters).
TINY_SD_CONFIGS = {
    "text_encoder": dict(
        vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=16, bos_token_id=998, eos_token_id=999, pad_token_id=999,
    ),
    "unet": dict(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32,
    ),
    "vae": dict(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64), norm_num_groups=32,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), sample_size=16,
    ),
    # Stable Diffusion 1.x's noise schedule
    "scheduler": dict(
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1, clip_sample=False,
        set_alpha_to_one=False,
    ),
}  # fmt: skip


def pipeline_from_configs(
    text_encoder: dict, unet: dict, vae: dict, scheduler: dict | None = None, *, scheduler_class: str = "DDIMScheduler",
    seed: int = 0,
):  # fmt: skip
    """A diffusers StableDiffusionPipeline with random weights (seeded) from config dicts:
    a transformers CLIPTextModel (CLIPTextConfig fields), a UNet2DConditionModel, an
    AutoencoderKL and a scheduler of `scheduler_class`. No tokenizer, safety checker or
    download: prompts go in as token ids (`prompt_embeds=` in diffusers' own call)."""
    import diffusers
    from transformers import CLIPTextConfig, CLIPTextModel

    if not hasattr(diffusers, scheduler_class) or not scheduler_class.endswith("Scheduler"):
        raise ValueError(f"scheduler_class must name a diffusers scheduler, got {scheduler_class!r}")
    torch.manual_seed(seed)
    pipe = diffusers.StableDiffusionPipeline(
        vae=diffusers.AutoencoderKL(**vae).eval(),
        text_encoder=CLIPTextModel(CLIPTextConfig(**text_encoder)).eval(),
        tokenizer=None,
        unet=diffusers.UNet2DConditionModel(**unet).eval(),
        scheduler=getattr(diffusers, scheduler_class).from_config(scheduler or {}),  # ignores fields it lacks
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---- what is refused -------------------------------------------------------------------
@dataclass
class Components:
    """The three models of a Stable-Diffusion-shaped pipeline (and its scheduler, if any)."""

    text_encoder: nn.Module
    unet: nn.Module
    vae: nn.Module
    scheduler: object = None

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)


def components_of(pipe) -> Components:
    """`text_encoder`, `unet`, `vae` (and `scheduler`) of a diffusers pipeline, a dict or
    any object carrying them as attributes."""
    get = pipe.get if isinstance(pipe, dict) else (lambda name: getattr(pipe, name, None))
    missing = [name for name in ("text_encoder", "unet", "vae") if not isinstance(get(name), nn.Module)]
    if missing:
        raise TypeError(
            f"pipe must be a StableDiffusionPipeline (or a dict / object with text_encoder, unet and vae "
            f"modules); {type(pipe).__name__} has no {', '.join(missing)}"
        )
    return Components(get("text_encoder"), get("unet"), get("vae"), get("scheduler"))


def check_supported(parts: Components) -> None:
    """Refuse, by name, configurations whose math the three signatures do not reproduce."""
    unet, vae, text = parts.unet.config, parts.vae.config, parts.text_encoder.config
    refused = {
        "addition_embed_type": "added conditions (SDXL's text_embeds/time_ids, image embeddings)",
        "class_embed_type": "class-label conditioning",
        "encoder_hid_dim_type": "a projection of the encoder states (image-prompt UNets)",
    }
    for name, what in refused.items():
        if getattr(unet, name, None) is not None:
            raise DiffusionExportError(
                f"unet.config.{name}={getattr(unet, name)!r}: {what} is not supported; "
                "the denoise signature takes latents, timestep, text embeddings and guidance scale only"
            )
    latent = getattr(vae, "latent_channels", None)
    if unet.in_channels != latent or unet.out_channels != latent:
        raise DiffusionExportError(
            f"unet.config.in_channels={unet.in_channels}, out_channels={unet.out_channels} but the VAE has "
            f"{latent} latent channels: only text-to-image UNets are supported "
            "(an inpainting UNet also takes the mask and masked-image latents)"
        )
    width = getattr(text, "hidden_size", None)
    if unet.cross_attention_dim != width:
        raise DiffusionExportError(
            f"unet.config.cross_attention_dim={unet.cross_attention_dim} does not match the text encoder's "
            f"hidden_size={width}"
        )
    if getattr(vae, "shift_factor", None):
        raise DiffusionExportError(
            f"vae.config.shift_factor={vae.shift_factor!r}: StableDiffusionPipeline decodes without it "
            "(an SD3/Flux VAE); not supported"
        )
    if getattr(text, "use_attention_mask", False):
        raise DiffusionExportError(
            "text_encoder.config.use_attention_mask=True: the encode_text signature takes no attention mask"
        )


def _check_size(parts: Components, height, width, text_len) -> tuple[int, int, int]:
    factor = parts.vae_scale_factor
    size = parts.unet.config.sample_size  # an int, or (height, width)
    default_h, default_w = (size, size) if isinstance(size, int) else size
    height = default_h * factor if height is None else height
    width = default_w * factor if width is None else width
    for name, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < factor or value % factor:
            raise ValueError(f"{name} must be a positive multiple of the VAE's scale factor ({factor}), got {value!r}")
    max_len = parts.text_encoder.config.max_position_embeddings
    text_len = max_len if text_len is None else text_len
    if isinstance(text_len, bool) or not isinstance(text_len, int) or not 1 <= text_len <= max_len:
        raise ValueError(
            f"text_len must be an int between 1 and the text encoder's {max_len} positions, got {text_len!r}"
        )
    return height, width, text_len


# ---- samples, references and verification ----------------------------------------------
def sample_inputs(parts: Components, height: int, width: int, text_len: int, seed: int = 0) -> dict[str, tuple]:
    """Seeded inputs of each signature (what the export traces with and verifies on)."""
    gen = torch.Generator().manual_seed(seed)
    channels = parts.vae.config.latent_channels
    factor = parts.vae_scale_factor
    latents = torch.randn(1, channels, height // factor, width // factor, generator=gen)
    ids = torch.randint(0, parts.text_encoder.config.vocab_size, (1, text_len), generator=gen, dtype=torch.int32)
    batch = 1 if embeds_guidance(parts.unet) else 2  # the prompt alone, or [negative, prompt]
    embeddings = torch.randn(batch, text_len, parts.text_encoder.config.hidden_size, generator=gen)
    t = float(parts.scheduler.config.num_train_timesteps // 2) if parts.scheduler is not None else 500.0
    return {
        "encode_text": (ids,),
        "denoise": (latents, torch.tensor([t]), embeddings, torch.tensor([7.5])),
        "decode_latents": (latents,),
    }


@torch.no_grad()
def reference_outputs(parts: Components, samples: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Each signature's output computed by the components as StableDiffusionPipeline calls them."""
    from diffusers.image_processor import VaeImageProcessor

    ids = samples["encode_text"][0]
    latents, t, embeddings, scale = samples["denoise"]
    if embeds_guidance(parts.unet):
        cond = guidance_scale_embedding(torch.tensor(float(scale) - 1).repeat(1), parts.unet.config.time_cond_proj_dim)
        noise = parts.unet(latents, t[0], encoder_hidden_states=embeddings, timestep_cond=cond, return_dict=False)[0]
    else:
        uncond, cond = parts.unet(torch.cat([latents] * 2), t[0], encoder_hidden_states=embeddings)[0].chunk(2)
        noise = uncond + float(scale) * (cond - uncond)
    decoded = parts.vae.decode(samples["decode_latents"][0] / parts.vae.config.scaling_factor, return_dict=False)[0]
    processor = VaeImageProcessor(vae_scale_factor=parts.vae_scale_factor)
    return {
        "encode_text": parts.text_encoder(ids.long())[0].numpy(),
        "denoise": noise.numpy(),
        "decode_latents": processor.postprocess(decoded, output_type="np", do_denormalize=[True]),
    }


@contextlib.contextmanager
def _eval_mode(*modules: nn.Module):
    flags = [(m, m.training) for module in modules for m in module.modules()]
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for m, training in flags:
            m.train(training)


@dataclass
class Verification:
    """Per signature: max relative error of LiteRT against the component's own forward."""

    errors: dict[str, float] = field(default_factory=dict)
    tolerance: float | None = TOLERANCE

    def worst(self) -> float:
        return max(self.errors.values())

    def __str__(self) -> str:
        return ", ".join(f"{name} {err:.2e}" for name, err in self.errors.items())


def verify_signatures(edge: EdgeModel, parts: Components, samples: dict[str, tuple], tolerance: float | None):
    """Run every signature in LiteRT on `samples` and compare with `reference_outputs`;
    raise DiffusionExportError above `tolerance` (None: measure only)."""
    from runtimes.litert import max_relative_error

    with _eval_mode(parts.text_encoder, parts.unet, parts.vae):  # as exported (dropout off); flags restored
        expected = reference_outputs(parts, samples)
    result = Verification(tolerance=tolerance)
    for name in SIGNATURES:
        got = edge(*samples[name], signature_name=name)
        result.errors[name] = float(max_relative_error(got, expected[name]))
    bad = {k: v for k, v in result.errors.items() if tolerance is not None and not v <= tolerance}
    if bad:
        raise DiffusionExportError(
            f"the converted signature(s) {sorted(bad)} differ from the components' own forward "
            f"(max relative error: {result}; tolerance {tolerance:g}); refusing to export a different model"
        )
    return result


# ---- export ------------------------------------------------------------------------------
def export_diffusion(
    pipe,
    *,
    height: int | None = None,
    width: int | None = None,
    text_len: int | None = None,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    **convert_options,
) -> EdgeModel:
    """Convert a Stable-Diffusion-shaped pipeline into one LiteRT model with the
    signatures `encode_text`, `denoise` and `decode_latents` (see the module docstring).

    pipe: a diffusers StableDiffusionPipeline, or a dict / object with `text_encoder`,
        `unet`, `vae` (and optionally `scheduler`, whose num_train_timesteps sets the
        verification's timestep). The models may live on any device.
    height, width: the image size (default: the UNet's sample_size times the VAE's scale
        factor); multiples of the VAE's scale factor. The file is for that size.
    text_len: token ids per prompt (default: the text encoder's max_position_embeddings,
        77 for CLIP: diffusers pads every prompt to it).
    verify: run each signature in LiteRT against the component's own forward (refused
        above `tolerance` when the model is float; with a quant_config measured only).
        The errors are on `edge.verification`.
    convert_options: go to `convert` (quant_config, target, progress...).
    """
    parts = components_of(pipe)
    parts = Components(cpu_view(parts.text_encoder), cpu_view(parts.unet), cpu_view(parts.vae), parts.scheduler)
    check_supported(parts)
    height, width, text_len = _check_size(parts, height, width, text_len)
    samples = sample_inputs(parts, height, width, text_len)
    modules = {
        "encode_text": (TextEncoder(parts.text_encoder), ["text_embeddings"]),
        "denoise": (_denoiser(parts.unet), ["noise_pred"]),
        "decode_latents": (LatentDecoder(parts.vae), ["image"]),
    }
    builder = None
    for name in SIGNATURES:
        module, outputs = modules[name]
        add = signature if builder is None else builder.signature
        builder = add(name, module, samples[name], output_names=outputs)
    edge = builder.convert(**convert_options)
    edge.verification = None
    if verify:
        quantized = convert_options.get("quant_config") is not None
        edge.verification = verify_signatures(edge, parts, samples, None if quantized else tolerance)
    return edge


@torch.no_grad()
def reference_image(
    pipe, prompt_ids, negative_prompt_ids=None, *, num_inference_steps: int = 50, guidance_scale: float = 7.5, latents
) -> np.ndarray:
    """diffusers' own StableDiffusionPipeline image for token ids (float32 [H, W, 3] in
    [0, 1]): the prompts are encoded by the pipeline's text encoder and passed as
    `prompt_embeds`, everything else is `pipe(...)` itself. The reference of
    `LiteRTDiffusionPipeline`."""
    device = pipe.text_encoder.device

    def embed(ids):
        ids = torch.as_tensor(np.asarray(ids)).reshape(1, -1).long().to(device)
        return pipe.text_encoder(ids)[0]

    negative = None if negative_prompt_ids is None else embed(negative_prompt_ids)
    latents = torch.as_tensor(np.asarray(latents, dtype=np.float32)).to(device)
    out = pipe(
        prompt_embeds=embed(prompt_ids),
        negative_prompt_embeds=negative,
        latents=latents,
        num_inference_steps=num_inference_steps,
        guidance_scale=guidance_scale,
        output_type="np",
    )
    return out.images[0]


# ---- the LiteRT pipeline -------------------------------------------------------------------
def _ids(value, name: str, text_len: int) -> np.ndarray:
    if value is None:
        raise ValueError(f"{name} is required")
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integer token ids, got dtype {arr.dtype}")
    arr = arr.reshape(1, -1) if arr.ndim == 1 else arr
    if arr.shape != (1, text_len):
        raise ValueError(
            f"{name} must hold {text_len} token ids (shape [{text_len}] or [1, {text_len}]: pad as the tokenizer "
            f"does to max_length), got shape {tuple(np.shape(value))}"
        )
    return arr.astype(np.int32)


class LiteRTDiffusionPipeline:
    """Text-to-image with an `export_diffusion` model in LiteRT and a NumPy scheduler:
    what StableDiffusionPipeline does, with token ids instead of a tokenizer.

    edge: the EdgeModel (or a path to the .tflite file).
    scheduler: a diffusers scheduler, its config dict (with "_class_name") or a
        `schedulers.NumpyScheduler` (DDIM, Euler discrete and PNDM are implemented).
    """

    def __init__(self, edge, scheduler, *, num_threads: int | None = None):
        if not isinstance(edge, EdgeModel):
            from litert_torch.edge_model import load

            edge = load(edge, num_threads=num_threads)
        names = {s.key for s in edge.signatures}
        missing = [n for n in SIGNATURES if n not in names]
        if missing:
            raise ValueError(
                f"edge has no signature(s) {missing}: make it with export_diffusion (it has {sorted(names)})"
            )
        self.edge = edge
        self.scheduler: NumpyScheduler = numpy_scheduler(scheduler)
        sigs = {s.key: s for s in edge.signatures}
        self.text_len = int(sigs["encode_text"].inputs[0].shape[-1])
        self.latent_shape = tuple(int(d) for d in sigs["denoise"].inputs[0].shape)
        # one text embedding: the UNet embeds the guidance scale (no negative prompt, no CFG)
        self.guidance_embedded = int(sigs["denoise"].inputs[2].shape[0]) == 1
        self.timings: dict[str, float] = {}  # seconds per signature, over the last call

    def _run(self, name: str, *args) -> np.ndarray:
        start = time.perf_counter()
        out = self.edge(*args, signature_name=name)
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
        return out

    def encode(self, prompt_ids, negative_prompt_ids=None) -> np.ndarray:
        """[negative; prompt] text embeddings, [2, L, D] (the prompt's alone, [1, L, D], for
        a guidance-embedding UNet)."""
        prompt = self._run("encode_text", _ids(prompt_ids, "prompt_ids", self.text_len))
        if self.guidance_embedded:
            return prompt
        negative = _ids(negative_prompt_ids, "negative_prompt_ids", self.text_len)
        return np.concatenate([self._run("encode_text", negative), prompt])

    def __call__(
        self,
        prompt_ids,
        negative_prompt_ids=None,
        *,
        num_inference_steps: int = 50,
        guidance_scale: float = 7.5,
        latents=None,
        seed: int | None = None,
        output: str = "image",
    ) -> np.ndarray:
        """One image, float32 [H, W, 3] in [0, 1] (`output="latents"`: the final latents).

        prompt_ids: the tokenized prompt padded to the file's text length (int, [L] or [1, L]).
        negative_prompt_ids: the tokenized negative prompt; for diffusers' default (no
            negative prompt) the tokenized empty prompt "". Required when guidance_scale > 1
            (unused with a guidance-embedding UNet).
        guidance_scale: classifier-free guidance; <= 1 means none (as in diffusers: the
            prompt's prediction alone). A guidance-embedding UNet (`time_cond_proj_dim`)
            takes it as an embedding of guidance_scale - 1 instead, as diffusers does.
        latents: the initial noise, [1, C, h, w] (diffusers' `latents=`; scaled by the
            scheduler's init_noise_sigma here as there); else drawn from N(0, 1) with
            NumPy's generator seeded with `seed` (not torch's: pass latents to reproduce a
            diffusers image).
        """
        if output not in ("image", "latents"):
            raise ValueError(f"output must be 'image' or 'latents', got {output!r}")
        if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, (int, float)):
            raise TypeError(f"guidance_scale must be a number, got {guidance_scale!r}")
        if self.guidance_embedded:  # the scale goes in as it is; no negative prompt is read
            negative_prompt_ids = None
        elif guidance_scale <= 1:  # the negative half is weighted 0: the prompt's prediction alone
            negative_prompt_ids, guidance_scale = prompt_ids, 1.0
        elif negative_prompt_ids is None:
            raise ValueError(
                "negative_prompt_ids is required when guidance_scale > 1: pass the tokenized negative prompt "
                '(diffusers\' default is the empty prompt "": bos, eos, then padding)'
            )
        prompt = _ids(prompt_ids, "prompt_ids", self.text_len)  # every argument checked before any work
        negative = None if self.guidance_embedded else _ids(negative_prompt_ids, "negative_prompt_ids", self.text_len)
        noise = self._initial_latents(latents, seed)
        self.scheduler.set_timesteps(num_inference_steps)
        self.timings = {}
        embeddings = self.encode(prompt, negative)
        x = (noise * np.float32(self.scheduler.init_noise_sigma)).astype(np.float32)
        scale = np.array([guidance_scale], np.float32)
        for i, t in enumerate(self.scheduler.timesteps):
            model_input = self.scheduler.scale_model_input(x, i)
            noise_pred = self._run("denoise", model_input, np.array([t], np.float32), embeddings, scale)
            x = self.scheduler.step(noise_pred, i, x)
        if output == "latents":
            return x
        return self._run("decode_latents", x)[0]

    def _initial_latents(self, latents, seed) -> np.ndarray:
        if latents is None:
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise TypeError(f"seed must be an int, got {seed!r}")
            return np.random.default_rng(seed).standard_normal(self.latent_shape, dtype=np.float32)
        if isinstance(latents, torch.Tensor):
            latents = latents.detach().cpu().numpy()
        latents = np.asarray(latents, dtype=np.float32)
        if latents.shape != self.latent_shape:
            raise ValueError(f"latents must have shape {list(self.latent_shape)}, got {list(latents.shape)}")
        return latents
