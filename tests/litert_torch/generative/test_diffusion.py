"""A Stable-Diffusion-shaped diffusers pipeline (random weights, tiny configs) exported as
three LiteRT signatures, and the NumPy schedulers, against diffusers itself.

The image contract: on the same initial latents, steps and guidance, the LiteRT pipeline's
float32 image is within IMAGE_TOLERANCE (max absolute, images in [0, 1]) of diffusers'
own `pipe(...)` image. Each signature is within 1e-4 (max relative) of its component's
forward, or the export is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litert_torch import quantize
from litert_torch.generative.diffusion import (
    TINY_SD_CONFIGS,
    DiffusionExportError,
    LiteRTDiffusionPipeline,
    check_supported,
    components_of,
    export_diffusion,
    pipeline_from_configs,
    reference_image,
    sample_inputs,
    verify_signatures,
)
from litert_torch.generative.schedulers import UnsupportedSchedulerError, numpy_scheduler

IMAGE_TOLERANCE = 1e-3  # max |LiteRT - diffusers| on [0, 1] images, float32 (seen: about 2e-6)
STEPS = 8


def _tiny(scheduler_class="DDIMScheduler", **overrides):
    configs = {k: dict(v) for k, v in TINY_SD_CONFIGS.items()}
    for part, fields in overrides.items():
        configs[part].update(fields)
    return pipeline_from_configs(**configs, scheduler_class=scheduler_class)


def _with_scheduler(pipe, scheduler):
    """The same components under another scheduler (the module's `pipe` keeps its own)."""
    import diffusers

    other = diffusers.StableDiffusionPipeline(**{**pipe.components, "scheduler": scheduler})
    other.set_progress_bar_config(disable=True)
    return other


@pytest.fixture(scope="module")
def pipe():
    return _tiny()


@pytest.fixture(scope="module")
def edge(pipe):
    return export_diffusion(pipe)


def _prompt(seed=0):
    gen = torch.Generator().manual_seed(seed)
    vocab, length = (
        TINY_SD_CONFIGS["text_encoder"]["vocab_size"],
        TINY_SD_CONFIGS["text_encoder"]["max_position_embeddings"],
    )
    ids = torch.randint(0, vocab, (1, length), generator=gen)
    negative = torch.randint(0, vocab, (1, length), generator=gen)
    latents = torch.randn(1, 4, 8, 8, generator=gen)
    return ids, negative, latents


def test_signatures_and_verification(edge):
    sigs = {s.key: s for s in edge.signatures}
    assert list(sigs) == ["encode_text", "denoise", "decode_latents"]
    assert [t.name for t in sigs["denoise"].inputs] == ["latents", "timestep", "text_embeddings", "guidance_scale"]
    assert [tuple(t.shape) for t in sigs["denoise"].inputs] == [(1, 4, 8, 8), (1,), (2, 16, 32), (1,)]
    assert str(sigs["encode_text"].inputs[0].dtype) == "int32"
    assert tuple(sigs["decode_latents"].outputs[0].shape) == (1, 16, 16, 3)
    assert sigs["decode_latents"].outputs[0].name == "image"
    errors = edge.verification.errors
    assert set(errors) == set(sigs) and max(errors.values()) <= 1e-4, edge.verification


@pytest.mark.parametrize("scheduler_class", ["DDIMScheduler", "EulerDiscreteScheduler", "PNDMScheduler"])
def test_image_matches_diffusers(pipe, edge, scheduler_class):
    import diffusers

    scheduler = getattr(diffusers, scheduler_class).from_config(pipe.scheduler.config)
    ids, negative, latents = _prompt()
    expected = reference_image(
        _with_scheduler(pipe, scheduler), ids, negative, num_inference_steps=STEPS, guidance_scale=7.5, latents=latents
    )
    run = LiteRTDiffusionPipeline(edge, scheduler)
    image = run(ids, negative, num_inference_steps=STEPS, guidance_scale=7.5, latents=latents)
    assert image.shape == expected.shape == (16, 16, 3)
    error = np.abs(image - expected).max()
    print(f"{scheduler_class}: max abs image error {error:.2e}")
    assert error <= IMAGE_TOLERANCE
    assert expected.std() > 0.05  # not a blank image


def test_without_guidance_matches_diffusers(pipe, edge):
    """guidance_scale <= 1: diffusers runs the prompt alone; so does the pipeline (weight 0 on the negative half)."""
    ids, _, latents = _prompt(1)
    expected = reference_image(pipe, ids, num_inference_steps=3, guidance_scale=1.0, latents=latents)
    image = LiteRTDiffusionPipeline(edge, pipe.scheduler)(
        ids, num_inference_steps=3, guidance_scale=1.0, latents=latents
    )
    assert np.abs(image - expected).max() <= IMAGE_TOLERANCE


def test_guidance_embedding_unet_matches_diffusers():
    """A UNet with `time_cond_proj_dim` (LCM-distilled models): `denoise` takes the prompt's
    embeddings alone and the scale as diffusers' embedding of guidance_scale - 1."""
    pipe = _tiny(unet={"time_cond_proj_dim": 16})
    edge = export_diffusion(pipe)
    denoise = {s.key: s for s in edge.signatures}["denoise"]
    assert tuple(denoise.inputs[2].shape) == (1, 16, 32)
    assert max(edge.verification.errors.values()) <= 1e-4, edge.verification
    ids, _, latents = _prompt(4)
    for scale in (1.0, 4.0):
        expected = reference_image(pipe, ids, num_inference_steps=4, guidance_scale=scale, latents=latents)
        image = LiteRTDiffusionPipeline(edge, pipe.scheduler)(
            ids, num_inference_steps=4, guidance_scale=scale, latents=latents
        )
        assert np.abs(image - expected).max() <= IMAGE_TOLERANCE, scale
    assert (
        np.abs(
            image
            - LiteRTDiffusionPipeline(edge, pipe.scheduler)(
                ids, num_inference_steps=4, guidance_scale=1.0, latents=latents
            )
        ).max()
        > 1e-3
    )  # the scale matters


def test_file_round_trip_and_seeded_latents(pipe, edge, tmp_path):
    path = edge.export(tmp_path / "sd.tflite")
    config = dict(pipe.scheduler.config, _class_name=type(pipe.scheduler).__name__)  # as scheduler_config.json
    run = LiteRTDiffusionPipeline(path, config)
    ids, negative, _ = _prompt(2)
    a = run(ids, negative, num_inference_steps=2, seed=3)
    b = run(ids[0].numpy(), negative[0].numpy(), num_inference_steps=2, seed=3)
    np.testing.assert_array_equal(a, b)
    assert set(run.timings) == {"encode_text", "denoise", "decode_latents"}


def test_a_pipeline_on_the_tpu_device_exports_and_stays_there():
    import tpu_backend  # noqa: F401  (registers the device)

    on_tpu = _tiny()
    for name in ("text_encoder", "unet", "vae"):
        getattr(on_tpu, name).to("tpu")
    edge = export_diffusion(on_tpu)
    assert max(edge.verification.errors.values()) <= 1e-4, edge.verification
    assert all(p.device.type == "tpu" for p in on_tpu.unet.parameters())


def test_bad_inputs_name_the_argument(pipe, edge):
    run = LiteRTDiffusionPipeline(edge, pipe.scheduler)
    ids, negative, latents = _prompt()
    with pytest.raises(ValueError, match="negative_prompt_ids is required"):
        run(ids, num_inference_steps=2, guidance_scale=7.5)
    with pytest.raises(ValueError, match=r"prompt_ids must hold 16 token ids"):
        run(ids[:, :5], negative, num_inference_steps=2)
    with pytest.raises(TypeError, match="prompt_ids must be integer token ids"):
        run(ids.float(), negative, num_inference_steps=2)
    with pytest.raises(ValueError, match=r"latents must have shape \[1, 4, 8, 8\]"):
        run(ids, negative, num_inference_steps=2, latents=latents[:, :2])
    with pytest.raises(ValueError, match="num_inference_steps must be between 1"):
        run(ids, negative, num_inference_steps=0)
    with pytest.raises(ValueError, match="height must be a positive multiple of the VAE's scale factor"):
        export_diffusion(pipe, height=15)
    with pytest.raises(ValueError, match="text_len must be an int between 1"):
        export_diffusion(pipe, text_len=99)
    with pytest.raises(TypeError, match="has no text_encoder, unet, vae"):
        export_diffusion(object())


def test_a_signature_off_by_more_than_the_tolerance_is_refused(pipe, edge):
    parts = components_of(pipe)
    samples = sample_inputs(parts, 16, 16, 16)
    with pytest.raises(DiffusionExportError, match=r"differ from the components' own forward .*encode_text .*denoise"):
        verify_signatures(edge, parts, samples, tolerance=1e-12)


@pytest.mark.parametrize(
    "part, fields, match",
    [
        ("unet", {"addition_embed_type": "text_time"}, r"addition_embed_type='text_time': added conditions"),
        ("unet", {"class_embed_type": "timestep"}, r"class_embed_type='timestep': class-label"),
        ("unet", {"in_channels": 9}, r"in_channels=9.*inpainting"),
        (
            "unet",
            {"cross_attention_dim": 48},
            r"cross_attention_dim=48 does not match the text encoder's hidden_size=32",
        ),
        ("vae", {"shift_factor": 0.1}, r"shift_factor=0.1"),
    ],
)
def test_refusals_say_why(part, fields, match):
    """Checked on the configs alone (nothing is converted)."""
    parts = components_of(pipeline_from_configs(**{k: dict(v) for k, v in TINY_SD_CONFIGS.items()}))
    getattr(parts, part).register_to_config(**fields)
    with pytest.raises(DiffusionExportError, match=match):
        check_supported(parts)


def test_quantized_dynamic_int8(pipe, edge):
    q = export_diffusion(pipe, quant_config=quantize.dynamic_int8())
    ids, negative, latents = _prompt()
    expected = reference_image(pipe, ids, negative, num_inference_steps=STEPS, guidance_scale=7.5, latents=latents)
    image = LiteRTDiffusionPipeline(q, pipe.scheduler)(ids, negative, num_inference_steps=STEPS, latents=latents)
    error = np.abs(image - expected).max()
    print(f"dynamic int8: {len(q):,} B ({len(q) / len(edge):.2f}x), max abs image error {error:.3f}, {q.verification}")
    assert len(q) < 0.4 * len(edge)
    assert q.verification.tolerance is None  # measured, not refused
    assert error < 0.25


# ---- NumPy schedulers against diffusers' own, step by step ---------------------------------
SCHEDULER_CASES = [
    ("DDIMScheduler", {}),
    ("DDIMScheduler", TINY_SD_CONFIGS["scheduler"]),
    (
        "DDIMScheduler",
        {"timestep_spacing": "trailing", "prediction_type": "v_prediction", "rescale_betas_zero_snr": True},
    ),
    (
        "DDIMScheduler",
        {"timestep_spacing": "linspace", "prediction_type": "sample", "beta_schedule": "squaredcos_cap_v2"},
    ),
    ("EulerDiscreteScheduler", {}),
    ("EulerDiscreteScheduler", {**TINY_SD_CONFIGS["scheduler"], "timestep_spacing": "leading"}),
    ("EulerDiscreteScheduler", {"timestep_spacing": "trailing", "prediction_type": "v_prediction"}),
    ("EulerDiscreteScheduler", {"use_karras_sigmas": True, "final_sigmas_type": "sigma_min"}),
    ("EulerDiscreteScheduler", {"use_exponential_sigmas": True, "rescale_betas_zero_snr": True}),
    ("PNDMScheduler", {}),
    ("PNDMScheduler", {**TINY_SD_CONFIGS["scheduler"], "skip_prk_steps": True}),  # SD 1.x's own
    ("PNDMScheduler", {"timestep_spacing": "trailing", "prediction_type": "v_prediction", "set_alpha_to_one": True}),
    ("PNDMScheduler", {"timestep_spacing": "linspace", "skip_prk_steps": True}),
]


def _known(cls, fields):
    import inspect

    return {k: v for k, v in fields.items() if k in inspect.signature(cls.__init__).parameters}


@pytest.mark.parametrize("name, fields", SCHEDULER_CASES)
@pytest.mark.parametrize("steps", [1, 7, 20])
def test_numpy_scheduler_steps_like_diffusers(name, fields, steps):
    import diffusers

    cls = getattr(diffusers, name)
    theirs = cls(**_known(cls, fields))
    ours = numpy_scheduler(theirs)
    if name == "PNDMScheduler" and not fields.get("skip_prk_steps") and steps < 4:  # diffusers fails on a shape
        with pytest.raises(ValueError, match="at least 4 for its Runge-Kutta warm-up"):
            ours.set_timesteps(steps)
        return
    theirs.set_timesteps(steps)
    ours.set_timesteps(steps)
    # exact but for the zero-terminal-SNR rescale, whose 1 - ratio amplifies the last bit of torch's
    # float32 sqrt (not correctly rounded on CPU; NumPy's is): fractional timesteps then move by <= 6e-5
    np.testing.assert_allclose(
        ours.timesteps, theirs.timesteps.numpy(), rtol=1e-4 if "rescale_betas_zero_snr" in fields else 1e-6
    )
    assert ours.init_noise_sigma == pytest.approx(float(theirs.init_noise_sigma), rel=1e-6)
    gen = torch.Generator().manual_seed(steps)
    sample = torch.randn(1, 4, 8, 8, generator=gen) * float(theirs.init_noise_sigma)
    x = sample.numpy()
    for i, t in enumerate(theirs.timesteps):
        scaled = theirs.scale_model_input(sample, t).numpy()
        assert np.abs(ours.scale_model_input(x, i) - scaled).max() <= 1e-5 * max(np.abs(scaled).max(), 1.0)
        out = torch.randn(1, 4, 8, 8, generator=gen)
        sample = theirs.step(out, t, sample).prev_sample
        x = ours.step(out.numpy(), i, x)
        # float32 rounding of the same arithmetic (the reference's own scale)
        assert np.abs(x - sample.numpy()).max() <= 1e-5 * max(float(sample.abs().max()), 1.0), (i, float(t))


@pytest.mark.parametrize(
    "scheduler, match",
    [
        ("DPMSolverMultistepScheduler", r"'DPMSolverMultistepScheduler' has no NumPy implementation .*from_config"),
        ({"num_train_timesteps": 1000}, "must name its class under '_class_name'"),
        ({"_class_name": "DDIMScheduler", "num_train_timesteps": 1000, "thresholding": True}, "thresholding=True"),
        ({"_class_name": "EulerDiscreteScheduler", "num_train_timesteps": 10, "use_beta_sigmas": True}, "beta"),
        (
            {"_class_name": "DDIMScheduler", "num_train_timesteps": 10, "beta_schedule": "cubic"},
            "beta_schedule='cubic'",
        ),
    ],
)
def test_unsupported_schedulers_say_why(scheduler, match):
    if isinstance(scheduler, str):
        import diffusers

        scheduler = getattr(diffusers, scheduler)()
    with pytest.raises((UnsupportedSchedulerError, ValueError), match=match):
        numpy_scheduler(scheduler)


# ---- other UNet / VAE / text-encoder layouts (slow: one export each, ~15 s) --------------------
LAYOUTS = {
    "sd2_like": dict(
        text_encoder={"hidden_act": "gelu"},
        unet={"use_linear_projection": True, "attention_head_dim": (2, 4), "upcast_attention": True},
        scheduler={"prediction_type": "v_prediction", "timestep_spacing": "trailing"},
    ),
    "scale_shift_no_quant_convs": dict(
        unet={"resnet_time_scale_shift": "scale_shift", "transformer_layers_per_block": 2, "flip_sin_to_cos": False},
        vae={"use_quant_conv": False, "use_post_quant_conv": False},
    ),
    "three_levels_mish_non_square": dict(
        unet={
            "block_out_channels": (32, 32, 64),
            "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
            "act_fn": "mish",
            "only_cross_attention": True,
        },
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_other_layouts_match_diffusers(layout):
    pipe = _tiny("EulerDiscreteScheduler", **LAYOUTS[layout])
    height, width = (16, 32) if "non_square" in layout else (16, 16)
    edge = export_diffusion(pipe, height=height, width=width)
    assert max(edge.verification.errors.values()) <= 1e-4, edge.verification
    ids, negative, _ = _prompt()
    latents = torch.randn(1, 4, height // 2, width // 2, generator=torch.Generator().manual_seed(5))
    expected = reference_image(pipe, ids, negative, num_inference_steps=6, latents=latents)
    image = LiteRTDiffusionPipeline(edge, pipe.scheduler)(ids, negative, num_inference_steps=6, latents=latents)
    assert image.shape == (height, width, 3)
    assert np.abs(image - expected).max() <= IMAGE_TOLERANCE
