"""Deployment target profiles: what each runtime accepts, as data.

A `Profile` is a declarative list of rules (ops and op options, dtypes, ranks, static
shapes, I/O dtypes, size limits); `check.py` applies them to any .tflite file and
`rewrites.py` holds the graph rewrites a profile asks for before the check. Every rule
cites where the fact comes from. Severity: a broken rule is an "error" when the target
cannot run the model as the profile promises (load failure, or for accelerator profiles
an op left off the accelerator), a "warning" when it runs but off the fast path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from runtimes.targets.model_view import OpView

# ---------------------------------------------------------------------------------- op lists

# TFLite/LiteRT GPU delegate (OpenCL, OpenGL ES, Metal and WebGPU share one graph builder):
# the ops `NewOperationParser` in tensorflow/lite/delegates/gpu/common/model_builder.cc
# accepts (TF 2.16 / LiteRT). EXPAND_DIMS and SQUEEZE are not among them: use RESHAPE.
GPU_OPS = frozenset(
    """
ABS ADD ADD_N AVERAGE_POOL_2D BATCH_MATMUL CAST CONCATENATION CONV_2D COS CUMSUM DENSIFY
DEPTH_TO_SPACE DEPTHWISE_CONV_2D DEQUANTIZE DIV ELU EQUAL EXP FLOOR FLOOR_DIV FLOOR_MOD
FULLY_CONNECTED GATHER GELU GREATER GREATER_EQUAL HARD_SWISH LEAKY_RELU LESS LESS_EQUAL LOG
LOGICAL_AND LOGISTIC LSTM MAXIMUM MAX_POOL_2D MEAN MINIMUM MIRROR_PAD MUL NEG NOT_EQUAL ONE_HOT
PACK PAD PADV2 POW PRELU QUANTIZE REDUCE_MAX REDUCE_MIN REDUCE_PROD RELU RELU6 RELU_N1_TO_1
RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR RSQRT SELECT_V2 SIGN SIN SLICE SOFTMAX
SPACE_TO_DEPTH SPLIT SPLIT_V SQRT SQUARE SQUARED_DIFFERENCE STRIDED_SLICE SUB SUM TANH TILE
TRANSPOSE TRANSPOSE_CONV
""".split()
)

# TensorFlow Lite Micro: the builtins `MicroMutableOpResolver::Add*` registers
# (tflite-micro tensorflow/lite/micro/micro_mutable_op_resolver.h), cross-checked against
# the `Register_*` kernels linked into the installed `tflite-micro` wheel. No GELU.
MICRO_OPS = frozenset(
    """
ABS ADD ADD_N ARG_MAX ARG_MIN ASSIGN_VARIABLE AVERAGE_POOL_2D BATCH_MATMUL BATCH_TO_SPACE_ND
BROADCAST_ARGS BROADCAST_TO CALL_ONCE CAST CEIL CONCATENATION CONV_2D COS CUMSUM DEPTH_TO_SPACE
DEPTHWISE_CONV_2D DEQUANTIZE DIV ELU EMBEDDING_LOOKUP EQUAL EXP EXPAND_DIMS FILL FLOOR
FLOOR_DIV FLOOR_MOD FULLY_CONNECTED GATHER GATHER_ND GREATER GREATER_EQUAL HARD_SWISH IF
L2_NORMALIZATION L2_POOL_2D LEAKY_RELU LESS LESS_EQUAL LOG LOGICAL_AND LOGICAL_NOT LOGICAL_OR
LOGISTIC LOG_SOFTMAX MAXIMUM MAX_POOL_2D MEAN MINIMUM MIRROR_PAD MUL NEG NOT_EQUAL PACK PAD
PADV2 PRELU QUANTIZE READ_VARIABLE REDUCE_MAX REDUCE_MIN RELU RELU6 RESHAPE RESIZE_BILINEAR
RESIZE_NEAREST_NEIGHBOR REVERSE_V2 ROUND RSQRT SELECT_V2 SHAPE SIN SLICE SOFTMAX
SPACE_TO_BATCH_ND SPACE_TO_DEPTH SPLIT SPLIT_V SQRT SQUARE SQUARED_DIFFERENCE SQUEEZE
STRIDED_SLICE SUB SUM SVDF TANH TRANSPOSE TRANSPOSE_CONV UNIDIRECTIONAL_SEQUENCE_LSTM UNPACK
VAR_HANDLE WHILE ZEROS_LIKE
""".split()
)

# Coral Edge TPU compiler, "Supported operations" table (coral.ai/docs/edgetpu/models-intro).
# Anything else (DEQUANTIZE, FLOOR_MOD, GELU ...) and everything after it runs on the CPU.
EDGETPU_OPS = frozenset(
    """
ADD AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTHWISE_CONV_2D EXPAND_DIMS FULLY_CONNECTED
L2_NORMALIZATION LOGISTIC LSTM MAXIMUM MAX_POOL_2D MEAN MINIMUM MUL PACK PAD PRELU QUANTIZE
REDUCE_MAX REDUCE_MIN RELU RELU6 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR
RSQRT SLICE SOFTMAX SPACE_TO_DEPTH SPLIT SQUARED_DIFFERENCE SQUEEZE STRIDED_SLICE SUB SUM TANH
TRANSPOSE TRANSPOSE_CONV
""".split()
)

# Ops whose filter/bias inputs XNNPACK wants constant (xnnpack_delegate.cc: "non-static
# filter/bias" nodes are left to the builtin kernels). Input positions of weight and bias.
WEIGHTED_OPS = {"CONV_2D": (1, 2), "DEPTHWISE_CONV_2D": (1, 2), "FULLY_CONNECTED": (1, 2), "TRANSPOSE_CONV": (1, 3)}

GB = 1 << 30


@dataclass(frozen=True)
class OpRule:
    """A condition on one op's options: `broken(op)` returns why it fails, or None."""

    opcode: str
    broken: Callable[[OpView], str | None]
    fix: str
    severity: str = "error"


@dataclass(frozen=True)
class Profile:
    """What one deployment target accepts. None / False means "no such limit"."""

    name: str
    runtime: str
    ops: frozenset[str] | None = None  # builtins it runs; None: every LiteRT builtin
    op_rules: tuple[OpRule, ...] = ()
    max_rank: int | None = None
    compute_dtypes: frozenset[str] | None = None  # dtypes of computed (non-constant) tensors
    integer_only: bool = False  # no op may compute in floating point
    io_dtypes: frozenset[str] | None = None
    static_shapes: bool = False
    max_file_bytes: int | None = None
    external_buffers: bool = True  # may read weights stored after the flatbuffer (>2 GB files)
    max_subgraphs: int | None = None
    constant_weights: bool = False  # XNNPACK: filters and biases must be constants
    buffer_alignment: int | None = None
    innermost_dims: int | None = None  # only this many innermost dims may exceed 1
    per_tensor_dequantize: bool = False
    weight_cache_bytes: int | None = None  # on-chip parameter memory (beyond it: slower)
    rewrites: tuple[str, ...] = ()  # names in rewrites.REWRITES, applied in order
    unsupported_severity: str = "error"  # an op the runtime lacks: fails, or falls back
    float_reason: str = "it runs integer models"  # why a float op breaks an integer_only profile
    notes: tuple[str, ...] = field(default_factory=tuple)


def _fused(op: OpView) -> str | None:
    act = op.options.get("fusedActivationFunction", "NONE")
    return None if act in ("NONE", 0) else f"has a fused {act} activation"


def _unequal_dilation(op: OpView) -> str | None:
    h, w = op.options.get("dilationHFactor", 1), op.options.get("dilationWFactor", 1)
    return None if h == w else f"dilation {h}x{w} differs between height and width"


def _batch_axis(op: OpView) -> str | None:
    axes = op.inputs[1] if len(op.inputs) > 1 else None
    # The axis tensor's values are not in the view; a reduction keeping rank over a
    # batch of size 1 is harmless, so only flag outputs that lost the leading dim.
    if axes is not None and op.inputs[0] is not None and op.outputs:
        src, dst = op.inputs[0].shape, op.outputs[0].shape
        if src and dst and len(dst) == len(src) and src[0] != dst[0]:
            return "reduces over the batch dimension"
    return None


# ---------------------------------------------------------------------------------- profiles

# CPU on phones and desktops: the builtin kernels plus XNNPACK (on by default).
# Rank limit 6: XNNPACK's XNN_MAX_TENSOR_DIMS; filters/biases constant and no int16x8
# (xnnpack_delegate.cc). Source: LiteRT docs "XNNPACK delegate" and its README.
_CPU = dict(
    ops=None,
    max_rank=6,
    constant_weights=True,
    unsupported_severity="error",
    notes=("XNNPACK runs float32, float16-weight and int8 ops; other ops use the builtin kernels.",),
)

ANDROID_CPU = Profile("android-cpu", "LiteRT on Android, CPU (builtin kernels + XNNPACK)", **_CPU)
IOS_CPU = Profile("ios-cpu", "LiteRT on iOS, CPU (builtin kernels + XNNPACK)", **_CPU)

# GPU delegates. Rank: the GPU graph is BHWC; tensors of rank 5+ are rejected
# (model_builder.cc ExtractTensorShape: "Tensor \"...\" has bad input dims size").
# dtypes: IsAllFloatTensors() accepts float32/float16 computed tensors (quantized models
# are dequantized by the delegate since TF 2.3: "GPU delegate ... quantized models").
# Unsupported ops are left on the CPU: the graph splits and tensors cross CPU<->GPU.
_GPU = dict(
    ops=GPU_OPS,
    max_rank=4,
    compute_dtypes=frozenset({"float32", "float16", "int8", "uint8"}),
    rewrites=("reshape_for_expand_squeeze", "reduce_rank"),
    unsupported_severity="error",
    notes=("An op the delegate cannot take runs on the CPU; the graph is split around it.",),
)
ANDROID_GPU = Profile("android-gpu", "LiteRT GPU delegate on Android (OpenCL / OpenGL ES)", **_GPU)
IOS_GPU = Profile("ios-gpu", "LiteRT GPU delegate on iOS (Metal)", **_GPU)

# LiteRT.js (@litertjs/core): WebAssembly CPU build (XNNPACK inside). I/O tensors float32,
# int32 or uint8 only: an int64 input fails at load ("Element type INT64 is not supported",
# seen with @litertjs/core 2.5.3); wasm32 memory is at most 2 GB (4 GB with memory64).
WEB = Profile(
    "web",
    "LiteRT.js in the browser (WebAssembly, XNNPACK)",
    ops=None,
    max_rank=6,
    constant_weights=True,
    io_dtypes=frozenset({"float32", "int32", "uint8"}),
    max_file_bytes=2 * GB,
    external_buffers=False,
    rewrites=("web_io_dtypes",),
)
# LiteRT.js with accelerator 'webgpu': the GPU delegate's rules plus the web's I/O rules.
WEB_GPU = Profile(
    "web-gpu",
    "LiteRT.js in the browser (WebGPU)",
    io_dtypes=WEB.io_dtypes,
    max_file_bytes=2 * GB,
    external_buffers=False,
    **{**_GPU, "rewrites": (*_GPU["rewrites"], "web_io_dtypes")},
)

# TensorFlow Lite Micro: full-integer models (its optimized kernels: CMSIS-NN, ESP-NN,
# Xtensa, are int8/int16 only; float kernels are reference code needing an FPU), static
# shapes (no dynamic tensors: micro_allocator plans the arena once), weights inside the
# flatbuffer (no external buffers), 16-byte aligned data (tflite-micro
# tflite_flatbuffer_align), DEQUANTIZE per-tensor only (dequantize.cc), entry subgraph 0
# (signatures are ignored).
MICRO = Profile(
    "micro",
    "TensorFlow Lite Micro (microcontrollers)",
    ops=MICRO_OPS,
    integer_only=True,
    compute_dtypes=frozenset({"int8", "int16", "int32", "bool", "uint8"}),
    static_shapes=True,
    external_buffers=False,
    max_subgraphs=1,
    buffer_alignment=16,
    per_tensor_dequantize=True,
    rewrites=("static_shapes",),
    float_reason=(
        "this profile is full-integer: TFLM's optimized kernels (CMSIS-NN, ESP-NN, Xtensa) are "
        "int8/int16 only, float ops fall back to slow reference kernels that need an FPU"
    ),
    notes=("Quantize with litert_torch.quantize.full_int8(...) before targeting micro.",),
)

# Coral Edge TPU (edgetpu_compiler): "Tensor parameters are quantized (8-bit fixed-point
# numbers; int8 or uint8)", "Tensor sizes are constant at compile-time", "Tensors are
# either 1-, 2-, or 3-dimensional. If a tensor has more than 3 dimensions, then only the
# 3 innermost dimensions may have a size greater than 1", "The model uses only the
# operations supported by the Edge TPU", one subgraph ("More than one subgraph is not
# supported"), about 8 MB of on-chip SRAM caches the parameters.
# (coral.ai/docs/edgetpu/models-intro "Model requirements" and "Supported operations".)
EDGETPU = Profile(
    "edgetpu",
    "Coral Edge TPU (edgetpu_compiler)",
    ops=EDGETPU_OPS,
    integer_only=True,
    compute_dtypes=frozenset({"int8", "uint8", "int32"}),
    static_shapes=True,
    max_subgraphs=1,
    innermost_dims=3,
    weight_cache_bytes=8 * (1 << 20),
    float_reason="the Edge TPU executes only 8-bit ops: this op and every op after it run on the CPU",
    op_rules=(
        # "AveragePool2d / MaxPool2d / Concatenation: No fused activation function."
        OpRule("AVERAGE_POOL_2D", _fused, "apply the activation as its own op"),
        OpRule("MAX_POOL_2D", _fused, "apply the activation as its own op"),
        OpRule("CONCATENATION", _fused, "apply the activation as its own op"),
        # "Conv2d / DepthwiseConv2d: Must use the same dilation in x and y dimensions."
        OpRule("CONV_2D", _unequal_dilation, "use the same dilation for height and width"),
        OpRule("DEPTHWISE_CONV_2D", _unequal_dilation, "use the same dilation for height and width"),
        # "Mean / ReduceMax / ReduceMin: No reduction in batch dimension."
        OpRule("MEAN", _batch_axis, "reduce over spatial/channel axes only"),
    ),
    rewrites=("static_shapes",),
)

PROFILES: dict[str, Profile] = {
    p.name: p for p in (ANDROID_CPU, ANDROID_GPU, IOS_CPU, IOS_GPU, WEB, WEB_GPU, MICRO, EDGETPU)
}


def get_profile(target) -> Profile:
    """The profile named `target` (a Profile passes through). Unknown names raise ValueError
    listing the known ones."""
    if isinstance(target, Profile):
        return target
    if not isinstance(target, str) or target.lower() not in PROFILES:
        raise ValueError(f"unknown target {target!r}; known targets: {', '.join(PROFILES)}")
    return PROFILES[target.lower()]
