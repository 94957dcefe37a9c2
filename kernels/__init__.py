"""Hand-written Pallas kernels for the hot spots of transformer training and serving.

One module per kernel, each with its plain-JAX (XLA) reference next to it:

| module | kernel | reference |
| --- | --- | --- |
| `flash_attention` | `flash_attention` (fwd + bwd, causal, masks, GQA/MQA, ragged) | `attention_reference` |
| `norms` | `rms_norm`, `layer_norm` (fwd + bwd, optional fused residual add) | `norm_reference` |
| `cross_entropy` | `cross_entropy` (fwd + bwd, chunked over the vocabulary) | `cross_entropy_reference` |
| `decode_attention` | `decode_attention` (one token over a KV cache, per-sequence length) | `decode_attention_reference` |
| `stack` | `stack` (equal arrays stacked by DMA: the scanned layers' weights) | `stack_reference` |
| `flash_attention_triton` | `flash_attention_triton` (GPU: Pallas's Triton backend; fwd + bwd, causal, GQA, ragged) | `flash_attention.attention_reference` |

`tuning` holds every block size (frozen dataclasses, per backend and shape); `tpu` the
chip table, the TPU block-layout rule and the per-program VMEM footprint, and
`tpu.lowering_for(chip)` to lower for a TPU on a machine without one; `check_lowering`
lowers every kernel over a grid of production shapes for a named chip. The package is
pure JAX (no torch): `tpu_backend.kernel_ops` wraps the kernels as
`torch.ops.tpu_kernels.*` custom ops and `tpu_backend.kernels` decides when PyTorch
calls use them. Every function takes `impl="pallas"` (compiled by Mosaic for TPU),
`"interpret"` (Pallas interpreter, any backend) or `"reference"`.

The modules import Pallas (about 1.5 s), so import them directly, not through this package.
"""


def __getattr__(name: str):
    """A name this package lacks. When another package is installed as `kernels` too
    (Hugging Face's, which transformers imports: `from kernels import CUDAProperties`), the
    ImportError says so and what to do (`common.package_names`)."""
    import importlib.util

    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is None:
        from common.package_names import clash_message, clashes

        found = clashes()
        if "kernels" in found:
            raise ImportError(
                f"cannot import name {name!r} from this project's `kernels` (the Pallas kernels, {__file__})\n"
                + clash_message(found)
            )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
