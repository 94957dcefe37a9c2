"""Random small PyTorch graphs from the converter's supported op set, for fuzzing.

`programs()` is a hypothesis strategy of `Program` specs: one or two inputs (float32 or
int32, rank 1-4), then 1-10 steps, each an op applied to earlier values: elementwise and
broadcasting binaries (with another value, a constant of a broadcastable shape, or a
scalar; int32 with float32 through type promotion), activations, comparisons (boolean
outputs), integer floor division / remainder / fmod, linear / matmul, layer and batch
norm, conv / pools / padding / upsampling in NCHW, reshape / permute / slice / cat /
flip / expand, reductions, argmax / argmin, cumsum, casts. Shapes are tracked so every program is
valid PyTorch; sizes stay small (at most 4,096 elements per value) to keep each case
fast. `Program(spec)` is the `nn.Module`, `sample_inputs(spec)` its inputs, and
`Forest(specs)` runs several programs side by side in one module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

MAX_NUMEL = 4096
F32, I32 = "float32", "int32"


@dataclass
class Value:
    shape: tuple[int, ...]
    dtype: str


@dataclass
class Spec:
    inputs: list[Value]
    steps: list[dict] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def __str__(self) -> str:  # what hypothesis prints for a failing case
        lines = [f"inputs: {[(v.shape, v.dtype) for v in self.inputs]}"]
        lines += [f"  v{len(self.inputs) + i} = {s}" for i, s in enumerate(self.steps)]
        return "\n".join(lines + [f"  outputs: {self.outputs}"])


FLOAT_UNARY = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": torch.nn.functional.gelu,
    "silu": torch.nn.functional.silu,
    "hardswish": torch.nn.functional.hardswish,
    "leaky_relu": torch.nn.functional.leaky_relu,
    "elu": torch.nn.functional.elu,
    "relu6": torch.nn.functional.relu6,
    "abs": torch.abs,
    "neg": torch.neg,
    "sin": torch.sin,
    "cos": torch.cos,
    "floor": torch.floor,
    "exp": lambda x: torch.exp(x.clamp(-6, 6)),
    "log": lambda x: torch.log(x.abs() + 1),
    "sqrt": lambda x: torch.sqrt(x.abs() + 1e-2),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5),
    "hardtanh": lambda x: torch.nn.functional.hardtanh(x, -0.5, 0.7),
    "square": lambda x: x * x,
}
INT_UNARY = {"abs": torch.abs, "neg": torch.neg, "double": lambda x: x * 2}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "where_gt": lambda a, b: torch.where(a > b, a, b * 2),
}
INT_BINARY = {"add", "sub", "mul", "maximum", "minimum", "where_gt"}
REDUCE = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin}


def _numel(shape) -> int:
    return math.prod(shape)


# ---- the strategy ------------------------------------------------------------------------------


@st.composite
def _shape(draw, min_rank=1, max_rank=4):
    rank = draw(st.integers(min_rank, max_rank))
    dims = [draw(st.integers(1, 6 if rank > 2 else 12)) for _ in range(rank)]
    return tuple(dims)


def _broadcastable_to(draw, shape):
    """A shape that broadcasts against `shape`: some dims 1, maybe fewer leading dims."""
    drop = draw(st.integers(0, len(shape) - 1)) if shape else 0
    return tuple(1 if draw(st.booleans()) else d for d in shape[drop:])


def _step(draw, values: list[Value]) -> tuple[dict, Value] | None:
    i = draw(st.integers(0, len(values) - 1))
    v = values[i]
    rank, shape = len(v.shape), v.shape
    if rank == 0:  # scalars (none are made today) take no dim-wise ops
        return None
    kinds = [
        "unary",
        "binary",
        "reduce",
        "permute",
        "reshape",
        "slice",
        "cat",
        "flip",
        "cast",
        "compare",
        "argmax",
        "cumsum",
        "mixed",
    ]
    if v.dtype == "bool":  # masks: only moved around, or cast to float
        kinds = ["permute", "reshape", "slice", "cat", "flip", "cast"]
    elif v.dtype == F32:
        kinds += ["linear", "matmul", "softmax", "binary", "unary", "layer_norm", "matmul_self"]
        if rank in (3, 4):
            kinds += ["pad"]
        if rank == 4:
            kinds += ["conv2d", "conv2d", "pool2d", "batch_norm", "upsample"]
        if rank == 3:
            kinds += ["conv1d"]
    else:
        kinds += ["int_div"]
    if 1 in shape:
        kinds.append("expand")
    kind = draw(st.sampled_from(kinds))
    if kind == "unary":
        name = draw(st.sampled_from(sorted(FLOAT_UNARY if v.dtype == F32 else INT_UNARY)))
        return {"op": "unary", "fn": name, "x": i}, v
    if kind == "compare":  # a boolean output, compared exactly
        fn = draw(st.sampled_from(["gt", "le", "eq", "ne"]))
        return {"op": "compare", "fn": fn, "x": i, "scalar": 0 if v.dtype == I32 else 0.25}, Value(shape, "bool")
    if kind == "argmax":
        if rank == 1:
            return None  # a 0-d result: every later op here works on dimensions
        dim = draw(st.integers(-rank, rank - 1))
        out = list(shape)
        del out[dim]
        return {"op": "argmax", "fn": draw(st.sampled_from(["argmax", "argmin"])), "dim": dim, "x": i}, Value(
            tuple(out), "int64"
        )
    if kind == "cumsum":
        return {"op": "cumsum", "dim": draw(st.integers(-rank, rank - 1)), "x": i}, Value(
            shape, F32 if v.dtype == F32 else "int64"
        )
    if kind == "mixed":  # int32 op float32: PyTorch's type promotion
        partners = [
            j
            for j, w in enumerate(values)
            if w.dtype in (F32, I32, "int64") and (w.dtype == F32) != (v.dtype == F32) and _compatible(v.shape, w.shape)
        ]
        if not partners:
            return None
        j = draw(st.sampled_from(partners))
        out_shape = tuple(torch.broadcast_shapes(v.shape, values[j].shape))
        if _numel(out_shape) > MAX_NUMEL:
            return None
        return {"op": "mixed", "fn": draw(st.sampled_from(["add", "mul", "sub"])), "x": i, "y": j}, Value(
            out_shape, F32
        )
    if kind == "int_div":  # floor division and remainder by a constant, negative values included
        return {
            "op": "int_div",
            "fn": draw(st.sampled_from(["floordiv", "remainder", "fmod"])),
            "k": draw(st.sampled_from([2, 3, -2, 5])),
            "x": i,
        }, v
    if kind == "layer_norm":
        return {"op": "layer_norm", "n": shape[-1], "x": i}, v
    if kind == "matmul_self":
        if rank < 2 or _numel(shape[:-1]) * shape[-2] > MAX_NUMEL:
            return None
        return {"op": "matmul_self", "x": i}, Value(shape[:-1] + (shape[-2],), F32)
    if kind == "pad":
        mode = draw(st.sampled_from(["constant", "reflect", "replicate"]))
        pads = [draw(st.integers(0, 2)) for _ in range(2 * (rank - 2))]
        if mode == "reflect" and any(p >= d for p, d in zip(pads, [shape[-1], shape[-1], shape[-2], shape[-2]])):
            return None
        out = list(shape)
        for k in range(rank - 2):
            out[-1 - k] += pads[2 * k] + pads[2 * k + 1]
        if _numel(out) > MAX_NUMEL:
            return None
        return {"op": "pad", "mode": mode, "pads": pads, "x": i}, Value(tuple(out), F32)
    if kind == "batch_norm":
        return {"op": "batch_norm", "c": shape[1], "x": i}, v
    if kind == "upsample":
        out = shape[:2] + (shape[2] * 2, shape[3] * 2)
        if _numel(out) > MAX_NUMEL:
            return None
        return {"op": "upsample", "mode": draw(st.sampled_from(["nearest", "bilinear"])), "x": i}, Value(out, F32)
    if kind == "softmax":
        dim = draw(st.integers(-rank, rank - 1))
        return {"op": "softmax", "log": draw(st.booleans()), "dim": dim, "x": i}, v
    if kind == "binary":
        names = sorted(BINARY if v.dtype == F32 else INT_BINARY)
        name = draw(st.sampled_from(names))
        partners = [j for j, w in enumerate(values) if w.dtype == v.dtype and _compatible(v.shape, w.shape)]
        source = draw(st.sampled_from(["value", "const", "scalar"] if partners else ["const", "scalar"]))
        step = {"op": "binary", "fn": name, "x": i, "source": source}
        if source == "value":
            j = draw(st.sampled_from(partners))
            step["y"] = j
            out_shape = tuple(torch.broadcast_shapes(v.shape, values[j].shape))
        elif source == "const":
            step["shape"] = _broadcastable_to(draw, shape)
            out_shape = shape
        else:
            step["scalar"] = (
                draw(st.sampled_from([0.5, 2.0, -1.5, 3.0])) if v.dtype == F32 else draw(st.integers(-3, 3))
            )
            out_shape = shape
        if _numel(out_shape) > MAX_NUMEL:
            return None
        return step, Value(out_shape, v.dtype)
    if kind == "reduce":
        names = sorted(REDUCE) if v.dtype == F32 else ["amax", "amin", "sum"]
        dim = draw(st.integers(-rank, rank - 1))
        keep = draw(st.booleans())
        if rank == 1 and not keep:
            keep = True
        out = list(shape)
        if keep:
            out[dim] = 1
        else:
            del out[dim]
        fn = draw(st.sampled_from(names))
        return {"op": "reduce", "fn": fn, "dim": dim, "keepdim": keep, "x": i}, Value(
            tuple(out), "int64" if fn == "sum" and v.dtype == I32 else v.dtype
        )
    if kind == "permute":
        perm = draw(st.permutations(range(rank)))
        return {"op": "permute", "perm": list(perm), "x": i}, Value(tuple(shape[p] for p in perm), v.dtype)
    if kind == "reshape":
        if rank >= 2 and draw(st.booleans()):  # merge two adjacent dims
            d = draw(st.integers(0, rank - 2))
            out = shape[:d] + (shape[d] * shape[d + 1],) + shape[d + 2 :]
        else:  # split a dim into two factors (or add a unit dim)
            d = draw(st.integers(0, rank - 1))
            factors = [f for f in range(1, shape[d] + 1) if shape[d] % f == 0]
            f = draw(st.sampled_from(factors))
            out = shape[:d] + (f, shape[d] // f) + shape[d + 1 :]
            if len(out) > 5:
                return None
        return {"op": "reshape", "shape": list(out), "x": i}, Value(tuple(out), v.dtype)
    if kind == "slice":
        d = draw(st.integers(0, rank - 1))
        start = draw(st.integers(0, shape[d] - 1))
        stop = draw(st.integers(start + 1, shape[d]))
        step = draw(st.integers(1, 3))
        out = list(shape)
        out[d] = len(range(start, stop, step))
        return {"op": "slice", "dim": d, "start": start, "stop": stop, "step": step, "x": i}, Value(tuple(out), v.dtype)
    if kind == "cat":
        d = draw(st.integers(0, rank - 1))
        partners = [
            j
            for j, w in enumerate(values)
            if w.dtype == v.dtype
            and len(w.shape) == rank
            and all(a == b for k, (a, b) in enumerate(zip(shape, w.shape)) if k != d)
        ]
        j = draw(st.sampled_from(partners))
        out = list(shape)
        out[d] += values[j].shape[d]
        if _numel(out) > MAX_NUMEL:
            return None
        return {"op": "cat", "dim": d, "x": i, "y": j}, Value(tuple(out), v.dtype)
    if kind == "flip":
        dims = sorted(set(draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank))))
        return {"op": "flip", "dims": dims, "x": i}, v
    if kind == "expand":
        out = tuple(draw(st.integers(1, 4)) if d == 1 else d for d in shape)
        if _numel(out) > MAX_NUMEL:
            return None
        return {"op": "expand", "shape": list(out), "x": i}, Value(out, v.dtype)
    if kind == "cast":
        return {"op": "cast", "x": i}, Value(shape, I32 if v.dtype == F32 else F32)
    if kind == "linear":
        out_features = draw(st.integers(1, 16))
        step = {"op": "linear", "in": shape[-1], "out": out_features, "bias": draw(st.booleans()), "x": i}
        return step, Value(shape[:-1] + (out_features,), F32)
    if kind == "matmul":
        k = draw(st.integers(1, 12))
        return {"op": "matmul", "k": k, "in": shape[-1], "x": i}, Value(shape[:-1] + (k,), F32)
    if kind in ("conv2d", "conv1d"):
        spatial = shape[2:]
        kernel = draw(st.integers(1, min(3, *spatial)))
        stride = draw(st.integers(1, 2))
        padding = draw(st.integers(0, kernel // 2))
        channels = shape[1]
        groups = draw(st.sampled_from([g for g in (1, 2, channels) if channels % g == 0]))
        out_channels = groups * draw(st.integers(1, 3))
        out = shape[:1] + (out_channels,) + tuple((s + 2 * padding - kernel) // stride + 1 for s in spatial)
        return {
            "op": kind,
            "in": channels,
            "out": out_channels,
            "kernel": kernel,
            "stride": stride,
            "padding": padding,
            "groups": groups,
            "x": i,
        }, Value(out, F32)
    if kind == "pool2d":
        kernel = draw(st.integers(1, min(3, *shape[2:])))
        stride = draw(st.integers(1, 2))
        padding = draw(st.integers(0, kernel // 2))
        ceil = draw(st.booleans())
        kind_ = draw(st.sampled_from(["max", "avg"]))
        probe = torch.zeros(shape)
        pool = torch.nn.functional.max_pool2d if kind_ == "max" else torch.nn.functional.avg_pool2d
        out = tuple(pool(probe, kernel, stride, padding, ceil_mode=ceil).shape)
        return {
            "op": "pool2d",
            "kind": kind_,
            "kernel": kernel,
            "stride": stride,
            "padding": padding,
            "ceil": ceil,
            "x": i,
        }, Value(out, F32)
    return None


def _compatible(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


@st.composite
def programs(draw, max_steps: int = 8) -> Spec:
    inputs = [Value(draw(_shape()), draw(st.sampled_from([F32, F32, F32, I32])))]
    if draw(st.booleans()):
        inputs.append(Value(draw(_shape()), draw(st.sampled_from([F32, I32]))))
    spec = Spec(inputs)
    values = list(inputs)
    for _ in range(draw(st.integers(1, max_steps))):
        made = _step(draw, values)
        if made is None:
            continue
        step, value = made
        spec.steps.append(step)
        values.append(value)
    if not spec.steps:
        spec.steps.append({"op": "unary", "fn": "neg", "x": 0})
        values.append(inputs[0])
    last = len(values) - 1
    outputs = [last]
    extra = draw(st.integers(len(inputs), last))
    if extra != last and draw(st.booleans()):
        outputs.append(extra)
    spec.outputs = outputs
    return spec


# ---- spec -> module ----------------------------------------------------------------------------


class Program(torch.nn.Module):
    """Runs a `Spec`: values[k] for inputs then steps; returns the chosen outputs."""

    def __init__(self, spec: Spec, seed: int = 0):
        super().__init__()
        self.spec = spec
        gen = torch.Generator().manual_seed(seed)
        self.layers = torch.nn.ModuleDict()
        self.consts = torch.nn.ParameterDict()
        torch.manual_seed(seed)
        for k, s in enumerate(spec.steps):
            key = str(k)
            if s["op"] == "linear":
                self.layers[key] = torch.nn.Linear(s["in"], s["out"], bias=s["bias"])
            elif s["op"] == "conv2d":
                self.layers[key] = torch.nn.Conv2d(
                    s["in"], s["out"], s["kernel"], s["stride"], s["padding"], groups=s["groups"]
                )
            elif s["op"] == "conv1d":
                self.layers[key] = torch.nn.Conv1d(
                    s["in"], s["out"], s["kernel"], s["stride"], s["padding"], groups=s["groups"]
                )
            elif s["op"] == "layer_norm":
                self.layers[key] = torch.nn.LayerNorm(s["n"])
                with torch.no_grad():
                    self.layers[key].weight.normal_(generator=gen)
                    self.layers[key].bias.normal_(generator=gen)
            elif s["op"] == "batch_norm":
                bn = self.layers[key] = torch.nn.BatchNorm2d(s["c"]).eval()
                with torch.no_grad():
                    bn.running_mean.normal_(generator=gen)
                    bn.running_var.uniform_(0.5, 2.0, generator=gen)
                    bn.weight.normal_(generator=gen)
                    bn.bias.normal_(generator=gen)
            elif s["op"] == "matmul":
                self.consts[key] = torch.nn.Parameter(torch.randn(s["in"], s["k"], generator=gen) / 2)
            elif s["op"] == "binary" and s["source"] == "const":
                x_dtype = self._dtype_of(s["x"])
                data = (
                    torch.randn(s["shape"], generator=gen)
                    if x_dtype == F32
                    else torch.randint(-4, 5, s["shape"], generator=gen, dtype=torch.int32)
                )
                self.consts[key] = torch.nn.Parameter(data, requires_grad=False)

    def _dtype_of(self, index: int) -> str:
        return _infer_dtypes(self.spec)[index]

    def forward(self, *inputs):
        values = list(inputs)
        for k, s in enumerate(self.spec.steps):
            values.append(_apply(self, str(k), s, values))
        outs = tuple(values[i] for i in self.spec.outputs)
        return outs[0] if len(outs) == 1 else outs


def _infer_dtypes(spec: Spec) -> list[str]:
    dtypes = [v.dtype for v in spec.inputs]
    for s in spec.steps:
        x = dtypes[s["x"]]
        if s["op"] == "cast":
            dtypes.append(I32 if x == F32 else F32)
        elif s["op"] in (
            "linear",
            "matmul",
            "conv2d",
            "conv1d",
            "pool2d",
            "softmax",
            "mixed",
            "layer_norm",
            "matmul_self",
            "pad",
            "batch_norm",
            "upsample",
        ):
            dtypes.append(F32)
        elif s["op"] == "compare":
            dtypes.append("bool")
        elif s["op"] == "argmax" or (s["op"] in ("cumsum", "reduce") and x == I32 and s.get("fn", "sum") == "sum"):
            dtypes.append("int64")
        else:
            dtypes.append(x)
    return dtypes


def _apply(m: Program, key: str, s: dict, values: list):
    x = values[s["x"]]
    op = s["op"]
    if op == "unary":
        return (FLOAT_UNARY if x.is_floating_point() else INT_UNARY)[s["fn"]](x)
    if op == "softmax":
        return (torch.log_softmax if s["log"] else torch.softmax)(x, s["dim"])
    if op == "compare":
        return {"gt": torch.gt, "le": torch.le, "eq": torch.eq, "ne": torch.ne}[s["fn"]](x, s["scalar"])
    if op == "argmax":
        return (torch.argmax if s["fn"] == "argmax" else torch.argmin)(x, s["dim"])
    if op == "cumsum":
        return torch.cumsum(x, s["dim"])
    if op == "mixed":
        return {"add": torch.add, "mul": torch.mul, "sub": torch.sub}[s["fn"]](x, values[s["y"]])
    if op == "int_div":
        if s["fn"] == "floordiv":
            return torch.floor_divide(x, s["k"])
        return (torch.remainder if s["fn"] == "remainder" else torch.fmod)(x, s["k"])
    if op in ("layer_norm", "batch_norm"):
        return m.layers[key](x)
    if op == "matmul_self":
        return x @ x.transpose(-1, -2)
    if op == "pad":
        return torch.nn.functional.pad(x, s["pads"], mode=s["mode"])
    if op == "upsample":
        if s["mode"] == "nearest":
            return torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
        return torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    if op == "binary":
        y = values[s["y"]] if s["source"] == "value" else m.consts[key] if s["source"] == "const" else s["scalar"]
        if not isinstance(y, torch.Tensor):
            y = torch.tensor(y, dtype=x.dtype)
        return BINARY[s["fn"]](x, y)
    if op == "reduce":
        return REDUCE[s["fn"]](x, s["dim"], keepdim=s["keepdim"])
    if op == "permute":
        return x.permute(s["perm"])
    if op == "reshape":
        return x.reshape(s["shape"])
    if op == "slice":
        index = [slice(None)] * x.dim()
        index[s["dim"]] = slice(s["start"], s["stop"], s["step"])
        return x[tuple(index)]
    if op == "cat":
        return torch.cat([x, values[s["y"]]], s["dim"])
    if op == "flip":
        return torch.flip(x, s["dims"])
    if op == "expand":
        return x.expand(s["shape"])
    if op == "cast":
        return x.to(torch.int32) if x.is_floating_point() else x.to(torch.float32)
    if op in ("linear", "conv2d", "conv1d"):
        return m.layers[key](x)
    if op == "matmul":
        return x @ m.consts[key]
    if op == "pool2d":
        if s["kind"] == "max":
            return torch.nn.functional.max_pool2d(x, s["kernel"], s["stride"], s["padding"], ceil_mode=s["ceil"])
        return torch.nn.functional.avg_pool2d(x, s["kernel"], s["stride"], s["padding"], ceil_mode=s["ceil"])
    raise ValueError(f"unknown step {s}")


class Forest(torch.nn.Module):
    """Several programs side by side in one module (inputs and outputs concatenated), so
    one conversion checks many cases: export and decomposition dominate the cost of a
    small conversion."""

    def __init__(self, specs: list[Spec]):
        super().__init__()
        self.programs = torch.nn.ModuleList(Program(s, seed=k) for k, s in enumerate(specs))

    def forward(self, *inputs):
        outs, start = [], 0
        for p in self.programs:
            n = len(p.spec.inputs)
            out = p(*inputs[start : start + n])
            outs += list(out) if isinstance(out, tuple) else [out]
            start += n
        return tuple(outs)


def forest_inputs(specs: list[Spec]) -> tuple[torch.Tensor, ...]:
    return tuple(x for k, s in enumerate(specs) for x in sample_inputs(s, seed=k))


def sample_inputs(spec: Spec, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for v in spec.inputs:
        if v.dtype == F32:
            out.append(torch.randn(v.shape, generator=gen) * 2)
        else:
            out.append(torch.randint(-5, 6, v.shape, generator=gen, dtype=torch.int32))
    return tuple(out)
