"""A Stable-Diffusion-shaped pipeline exported to LiteRT and run with a NumPy scheduler.

    .venv/bin/python examples/stable_diffusion.py                 # 128x128, 20 steps
    .venv/bin/python examples/stable_diffusion.py --steps 4 --size 64 --no-int4

The pipeline is diffusers' StableDiffusionPipeline built from small configs with random
weights (nothing is downloaded): a CLIP text encoder (77 positions), a UNet with SD 1.x's
layout (three cross-attention levels and a plain one, two layers per block) and a
four-level VAE (scale factor 8), under SD 1.x's noise schedule. `export_diffusion` writes
one file with three signatures (encode_text, denoise with classifier-free guidance,
decode_latents), each checked in LiteRT against the component's own forward. Then the
same prompt ids and initial latents go through diffusers' own `pipe(...)` and through
`LiteRTDiffusionPipeline`; printed: per variant (float32, dynamic int8, int4 weights)
the file size, each signature's weights, latency per call (LiteRT's default one thread;
PyTorch eager on one thread for comparison) and error against PyTorch, and the image's
largest difference from diffusers' image.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flow import cli, console, results_table, torch_cpu_latency_us  # noqa: E402

from litert_torch import quantize  # noqa: E402
from litert_torch.generative.diffusion import (  # noqa: E402
    SIGNATURES,
    GuidedDenoiser,
    LatentDecoder,
    LiteRTDiffusionPipeline,
    TextEncoder,
    components_of,
    export_diffusion,
    pipeline_from_configs,
    reference_image,
    sample_inputs,
)

CONFIGS = {
    "text_encoder": dict(
        vocab_size=4096, hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=77, bos_token_id=4094, eos_token_id=4095, pad_token_id=4095,
    ),
    "unet": dict(
        in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(64, 128, 128, 128),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=128, attention_head_dim=8, norm_num_groups=32, sample_size=16,
    ),
    "vae": dict(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64, 64, 64),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, norm_num_groups=32, sample_size=128,
    ),
    "scheduler": dict(
        beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1, clip_sample=False,
        set_alpha_to_one=False,
    ),
}  # fmt: skip

VARIANTS = {
    "float32": None,
    "dynamic int8": quantize.dynamic_int8(),
    "int4 weights": quantize.weight_only_int4(block_size=32),
}

COLUMNS = ["variant", "signature", "weights", "latency / call", "max rel err vs PyTorch"]


def signature_weight_bytes(edge) -> dict[str, int]:
    """Bytes of constants each signature's graph holds (int4 counted at half a byte)."""
    sizes = {}
    for graph in edge.ir_model.graphs:
        seen = {}
        for tensor in graph.tensors():
            if tensor.is_const:
                int4 = tensor.quant is not None and getattr(tensor.quant, "int4", False)
                seen[tensor.id] = tensor.nbytes // 2 if int4 else tensor.nbytes
        sizes[graph.name] = sum(seen.values())
    return sizes


def prompt(seed: int, vocab: int, length: int):
    """Token ids of a prompt and of a negative prompt (bos, words, eos, padding), and initial latents."""
    gen = torch.Generator().manual_seed(seed)
    bos, eos = CONFIGS["text_encoder"]["bos_token_id"], CONFIGS["text_encoder"]["eos_token_id"]
    words = torch.randint(0, vocab - 2, (9,), generator=gen)
    ids = torch.full((1, length), eos)
    ids[0, 0], ids[0, 1:10] = bos, words
    negative = torch.full((1, length), eos)
    negative[0, 0] = bos  # the empty prompt ""
    return ids, negative, gen


def run(steps: int = 20, size: int = 128, guidance: float = 7.5, int8: bool = True, int4: bool = True) -> dict:
    configs = {k: dict(v) for k, v in CONFIGS.items()}
    pipe = pipeline_from_configs(**configs)
    params = {
        name: sum(p.numel() for p in getattr(pipe, name).parameters()) for name in ("text_encoder", "unet", "vae")
    }
    ids, negative, gen = prompt(0, configs["text_encoder"]["vocab_size"], 77)
    latents = torch.randn(1, 4, size // 8, size // 8, generator=gen)
    expected = reference_image(pipe, ids, negative, num_inference_steps=steps, guidance_scale=guidance, latents=latents)
    results = {"steps": steps, "size": size, "params": params}
    samples = sample_inputs(components_of(pipe), size, size, 77)
    modules = {"encode_text": TextEncoder(pipe.text_encoder), "denoise": GuidedDenoiser(pipe.unet)}
    modules["decode_latents"] = LatentDecoder(pipe.vae)
    results["pytorch_ms"] = {  # each signature's module in PyTorch eager, one CPU thread
        name: torch_cpu_latency_us(modules[name], samples[name], repeats=3, warmup=1) / 1e3 for name in SIGNATURES
    }
    wanted = {"float32": True, "dynamic int8": int8, "int4 weights": int4}
    for name, config in VARIANTS.items():
        if not wanted[name]:
            continue
        start = time.perf_counter()
        edge = export_diffusion(pipe, height=size, width=size, quant_config=config)
        export_s = time.perf_counter() - start
        litert = LiteRTDiffusionPipeline(edge, pipe.scheduler)
        start = time.perf_counter()
        image = litert(ids, negative, num_inference_steps=steps, guidance_scale=guidance, latents=latents)
        calls = {"encode_text": 2, "denoise": steps, "decode_latents": 1}
        results[name] = {
            "bytes": len(edge),
            "export_s": export_s,
            "pipeline_s": time.perf_counter() - start,
            "image_max_abs_error": float(np.abs(image - expected).max()),
            "weights": signature_weight_bytes(edge),
            "latency_ms": {k: 1e3 * litert.timings[k] / calls[k] for k in SIGNATURES},
            "errors": dict(edge.verification.errors),
        }
    return results


def table_rows(results: dict) -> list[list[str]]:
    rows = [
        [
            "PyTorch (CPU, 1 thread)" if sig == SIGNATURES[0] else "",
            sig,
            "-",
            f"{results['pytorch_ms'][sig]:.1f} ms",
            "-",
        ]
        for sig in SIGNATURES
    ]
    for name in VARIANTS:
        if name in results:
            r = results[name]
            for sig in SIGNATURES:
                rows.append(
                    [
                        name if sig == SIGNATURES[0] else "",
                        sig,
                        f"{r['weights'][sig] / 1e6:.2f} MB",
                        f"{r['latency_ms'][sig]:.1f} ms",
                        f"{r['errors'][sig]:.1e}",
                    ]
                )
    return rows


def report(results: dict) -> None:
    p = results["params"]
    title = (
        f"SD-shaped pipeline, random weights ({p['text_encoder'] / 1e6:.1f}M text, {p['unet'] / 1e6:.1f}M UNet, "
        f"{p['vae'] / 1e6:.1f}M VAE), {results['size']}x{results['size']}, {results['steps']} DDIM steps"
    )
    console.print(results_table(title, COLUMNS, table_rows(results)))
    for name in VARIANTS:
        if name in results:
            r = results[name]
            console.print(
                f"{name}: file {r['bytes'] / 1e6:.2f} MB, image max |LiteRT - diffusers| {r['image_max_abs_error']:.2e}"
                f" (images in [0, 1]), export {r['export_s']:.1f} s, pipeline {r['pipeline_s']:.1f} s"
            )


def main(argv=None) -> dict:
    return cli(__doc__, run, report, argv, steps=20, size=128, guidance=7.5, int8=True, int4=True)


if __name__ == "__main__":
    main()
