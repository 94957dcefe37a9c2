"""`scan_layers`: a model's repeated blocks compiled once, as one `lax.scan`, forward and
backward, with the same losses and gradients as the unrolled layers and PyTorch CPU eager."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import tpu_backend  # noqa: F401  (registers the device)
import tpu_backend.compile as tpu_compile
from benchmarks.models import LlamaConfig, LlamaLM, make_optimizer, sequence_loss
from kernels import tpu as kernels_tpu
from tests import chip
from tpu_backend.compile import compiled_graph, scan

STEPS = 3
# float32, the same ops per layer in a loop instead of unrolled: XLA may fuse and sum in
# another order, so losses agree to 1e-5 relative and gradients to 1e-5 of their scale.
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(autouse=True)
def _fresh(fresh_dynamo):
    scan._warned.clear()


def train(model: nn.Module, device: str, mark: bool, batches) -> tuple[list[float], list[dict]]:
    """Losses and every parameter's gradient, step by step (AdamW)."""
    model = copy.deepcopy(model).to(device)
    if mark:
        tpu_compile.scan_layers(model.blocks)
    run = torch.compile(model, backend="tpu") if device == "tpu" else model
    optimizer = make_optimizer("adamw", model.parameters())
    losses, grads = [], []
    for inputs, target in batches:
        optimizer.zero_grad()
        loss = sequence_loss(run(inputs.to(device)), target.to(device))
        loss.backward()
        losses.append(loss.item())
        grads.append({name: p.grad.cpu() for name, p in model.named_parameters()})
        optimizer.step()
    return losses, grads


def batches(config: LlamaConfig) -> list:
    generator = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, config.vocab, (2, config.context + 1), generator=generator) for _ in range(STEPS)]
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def programs_text(folder: Path) -> dict[str, str]:
    """The StableHLO of each compiled model program, by kind (forward, backward)."""
    texts = {}
    for path in sorted(folder.glob("torch_compile_*.stablehlo.mlir")):
        kind = path.name.split(".")[0].rsplit("_", 1)[-1]
        texts[kind] = path.read_text()
    return texts


def assert_same_training(expected, actual, what: str, grad_tolerance: float = 1e-5) -> None:
    """Losses to RTOL; each gradient to `grad_tolerance` of its largest element."""
    (losses_a, grads_a), (losses_b, grads_b) = expected, actual
    assert losses_b == pytest.approx(losses_a, rel=RTOL), what
    for step, (a, b) in enumerate(zip(grads_a, grads_b)):
        assert a.keys() == b.keys()
        for name in a:
            scale = a[name].abs().max().item()
            torch.testing.assert_close(
                b[name],
                a[name],
                rtol=RTOL,
                atol=grad_tolerance * scale + ATOL,
                msg=lambda detail, step=step, name=name: f"{what}: step {step} grad of {name}\n{detail}",
            )


# the slow suite (the default run trains a scanned Llama against eager in test_the_backward_takes_the_forwards_stacks_as_they_are)
@pytest.mark.slow
@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_scanned_layers_train_like_unrolled_and_eager(remat, tmp_path):
    config = LlamaConfig(layers=3, checkpoint="full" if remat else "none")
    torch.manual_seed(0)
    model = LlamaLM(config)
    data = batches(config)
    eager = train(model, "cpu", False, data)
    with tpu_compile.dump(tmp_path / "unrolled"):
        unrolled = train(model, "tpu", False, data)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught, tpu_compile.dump(tmp_path / "scan"):
        warnings.simplefilter("always")
        scanned = train(model, "tpu", True, data)
    assert not [w for w in caught if "compiled unrolled" in str(w.message)]
    assert_same_training(eager, unrolled, "unrolled vs eager")
    assert_same_training(eager, scanned, "scan vs eager")

    unrolled_text, scanned_text = programs_text(tmp_path / "unrolled"), programs_text(tmp_path / "scan")
    assert set(scanned_text) == {"forward", "backward"}
    for kind, text in scanned_text.items():
        assert text.count("stablehlo.while") == 1, f"{kind}: the layers should be one loop"
        assert "stablehlo.while" not in unrolled_text[kind]
        # One block body in the loop instead of three copies: far fewer matmuls in the program
        assert text.count("stablehlo.dot_general") < unrolled_text[kind].count("stablehlo.dot_general")


@pytest.mark.slow
def test_kernels_inside_the_scanned_block(tmp_path):
    """The Pallas kernels (attention, RMSNorm: custom ops inside the block's subgraph) run
    inside the loop (interpreted here; compiled on a TPU in mode "auto")."""
    from tpu_backend import kernels

    config = LlamaConfig(layers=3, width=64, heads=2, ffn=128, context=64)  # head dim 32: the kernels take it
    torch.manual_seed(0)
    model = LlamaLM(config)
    data = batches(config)[:2]
    eager = train(model, "cpu", False, data)
    kernels.reset_stats()
    with kernels.use("interpret"), tpu_compile.dump(tmp_path):
        scanned = train(model, "tpu", True, data)
        used = kernels.stats()
    assert used.get("scaled_dot_product_attention: kernel") and used.get("rms_norm: kernel")
    (forward_graph,) = tmp_path.glob("torch_compile_*_forward.fx.py")
    assert "tpu_kernels.flash_attention" in forward_graph.read_text()
    # on a v5e the kernels' exp and sums differ from CPU's in the last bits, and one AdamW
    # step carries that into step 1's gradients: 6.6e-4 of the largest (blocks.0.gate.weight)
    tolerance = chip.tolerance("transcendentals", cpu=1e-5, tpu=2e-3)
    assert_same_training(eager, scanned, "scan with kernels vs eager", grad_tolerance=tolerance)


def _saved_for_backward(before: set) -> int:
    """Bytes the forward program compiled since `before` hands on (saved values, the output)."""
    [forward] = [p for p in tpu_compile.programs() if p.name.endswith("_forward") and p.name not in before]
    [exported] = forward.export(platforms=(jax.default_backend(),))  # a chip's kernels lower for the chip only
    return sum(a.size * a.dtype.itemsize for a in exported.out_avals)


def test_the_backward_takes_the_forwards_stacks_as_they_are(monkeypatch):
    # rows.py: the forward returns each stack its scan built (the layers' weights, the
    # layers' inputs) once, its rows views of one storage; the backward takes those stacks
    # whole, in a program compiled ahead for that layout (the plain one never compiles)
    monkeypatch.setenv("TPU_COMPILE_AHEAD", "on")
    graphs = {}
    compile_for_tpu = compiled_graph.compile_for_tpu

    def spy(gm, name, *args, **kwargs):
        graphs[name.rsplit("_", 1)[-1]] = compiled = compile_for_tpu(gm, name, *args, **kwargs)
        return compiled

    monkeypatch.setattr(compiled_graph, "compile_for_tpu", spy)
    config = LlamaConfig(layers=3, checkpoint="full")
    torch.manual_seed(0)
    model = LlamaLM(config)
    data = batches(config)
    assert_same_training(train(model, "cpu", False, data), train(model, "tpu", True, data), "scan vs eager")

    backward = graphs["backward"]
    [(layout, program)] = backward._row_programs.items()
    rows_of_base: dict = {}
    for _, base, row in layout:
        rows_of_base.setdefault(base, []).append(row)
    # 9 weights per layer and the layers' inputs; the last layer's backward is called on
    # its own (scan.FIRST_REPETITION_TIED), so each stack gives all 3 rows
    assert len(rows_of_base) == 10 and all(sorted(r) == [0, 1, 2] for r in rows_of_base.values()), layout
    assert backward.program.signatures == [] and len(program.signatures) == 1


def test_returned_rows_are_their_own_tensors_and_a_saved_one_written_in_place_fails_as_in_eager():
    # A Hugging Face Llama's hidden states are its layers' inputs: rows of one stack
    # (rows.py) that the backward also saves. Each row has its own version counter; the
    # user's hidden state and the saved one share theirs, so writing it fails as in eager.
    # Kernels off, so that the chip checks what CPU does (on a v5e with the kernels on this
    # test failed; the reason was not captured)
    import transformers

    from tpu_backend import kernels

    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 128, (2, 24))
    expected = model(input_ids=ids, labels=ids, output_hidden_states=True)
    device_model = copy.deepcopy(model).to("tpu")
    device_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tpu_compile.scan_layers(device_model.model.layers)
    run = torch.compile(device_model, backend="tpu")

    with kernels.use("off"):
        out = run(input_ids=ids.to("tpu"), labels=ids.to("tpu"), output_hidden_states=True)
        layer_inputs = out.hidden_states[:3]
        assert len({h.untyped_storage()._cdata for h in layer_inputs}) == 1  # rows of one stack
        for got, want in zip(out.hidden_states, expected.hidden_states):
            torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=RTOL, atol=1e-5)
        versions = [h._version for h in layer_inputs]
        layer_inputs[1].add_(1.0)
        assert [h._version for h in layer_inputs] == [versions[0], versions[1] + 1, versions[2]]
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (out.loss + layer_inputs[1].sum()).backward()
    eager = model(input_ids=ids, labels=ids, output_hidden_states=True)
    eager.hidden_states[1].add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (eager.loss + eager.hidden_states[1].sum()).backward()


@pytest.mark.slow  # a property of the step's cost (bytes between the programs); the time budget
def test_keeping_the_matmuls_keeps_them_in_the_scan(tmp_path):
    # torch.utils.checkpoint with `save_matmuls` inside the scanned block: the forward hands
    # the backward more than a full recompute and less than no checkpointing, one loop each
    data = batches(LlamaConfig())[:1]
    torch.manual_seed(0)
    eager = train(LlamaLM(LlamaConfig(layers=3)), "cpu", False, data)
    saved = {}
    for policy in ("none", "full", "matmuls"):
        torch.manual_seed(0)
        model = LlamaLM(LlamaConfig(layers=3, checkpoint=policy))
        before = {p.name for p in tpu_compile.programs()}
        with warnings.catch_warnings(record=True) as caught, tpu_compile.dump(tmp_path / policy):
            warnings.simplefilter("always")
            scanned = train(model, "tpu", True, data)
        saved[policy] = _saved_for_backward(before)
        assert not [w for w in caught if "compiled unrolled" in str(w.message)], policy
        for kind, text in programs_text(tmp_path / policy).items():
            assert text.count("stablehlo.while") == 1, f"{policy} {kind}: the layers should be one loop"
        assert_same_training(eager, scanned, f"checkpoint={policy!r}, scanned, vs eager")
    # at least the products the backward reads (q, k, v, gate, up; o's and down's only feed
    # sums), float32, in every layer
    config, tokens = LlamaConfig(layers=3), data[0][0].numel()
    products = config.layers * tokens * (3 * config.width + 2 * config.ffn) * 4
    assert saved["matmuls"] - saved["full"] >= products, saved
    assert saved["matmuls"] < saved["none"], saved


@pytest.mark.skipif(
    kernels_tpu.libtpu_version() is None, reason="compiling for a TPU needs libtpu (tools/setup.sh installs it)"
)
def test_compiled_for_a_tpu_the_layers_weights_are_stacked_by_dma():
    # XLA's TPU compiler splits a stack into asynchronous slices ("ConcatBitcast"): ~0.7 s
    # of compile per weight of a 24-layer model; the scan stacks them by DMA on a TPU
    config = LlamaConfig(layers=3)
    before = set(tpu_compile.programs())  # the objects: a graph loaded from AOTAutograd's cache keeps its name
    torch.manual_seed(0)
    train(LlamaLM(config), "tpu", True, batches(config)[:1])
    compiled = {}
    for program in tpu_compile.programs():
        if program not in before and program.name.startswith("torch_compile_"):
            [exported] = program.export(platforms=("tpu",), chip="v5e")
            compiled[program.name.rsplit("_", 1)[-1]] = kernels_tpu.compile_for(
                "v5e", exported.call, *exported.in_avals
            )
    assert set(compiled) == {"forward", "backward"}
    for kind, executable in compiled.items():
        assert "ConcatBitcast" not in executable.as_text(), f"{kind}: a stack was left to XLA"
    stacks = {kind: re.findall(r"= f32\[3,(\d+),(\d+)\][^ ]* custom-call", e.as_text()) for kind, e in compiled.items()}
    weights = {("32", "32"), ("64", "32"), ("32", "64")}  # the block's 7 matrices
    assert sum(shape in weights for shape in stacks["forward"]) == 7, stacks["forward"]
    # the backward takes the forward's stacks (rows.py) instead of stacking the weights again
    assert not weights & set(stacks["backward"]), stacks["backward"]


def test_inference_scans_too(tmp_path):
    config = LlamaConfig(layers=3)
    torch.manual_seed(0)
    model = LlamaLM(config).eval()
    tokens = batches(config)[0][0]
    with torch.no_grad():
        expected = model(tokens)
        device_model = copy.deepcopy(model).to("tpu")
        tpu_compile.scan_layers(device_model.blocks)
        with tpu_compile.dump(tmp_path):
            logits = torch.compile(device_model, backend="tpu")(tokens.to("tpu"))
    assert programs_text(tmp_path)["inference"].count("stablehlo.while") == 1
    torch.testing.assert_close(logits.cpu(), expected, rtol=RTOL, atol=1e-5)


@pytest.mark.slow
def test_the_loop_body_does_not_grow_with_the_layers(tmp_path):
    counts = {}
    for layers in (2, 4):
        torch._dynamo.reset()
        config = LlamaConfig(layers=layers)
        torch.manual_seed(0)
        with tpu_compile.dump(tmp_path / str(layers)):
            train(LlamaLM(config), "tpu", True, batches(config)[:1])
        texts = programs_text(tmp_path / str(layers))
        counts[layers] = {kind: text.count("stablehlo.dot_general") for kind, text in texts.items()}
    assert counts[2] == counts[4]


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, scale):
        return x + torch.tanh(self.linear(x)) * scale


class Stack(nn.Module):
    """Blocks whose second input is computed from the previous block's output: not a scan."""

    def __init__(self, layers: int = 4, tied: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList(Scaled() for _ in range(layers))
        self.tied = tied

    def forward(self, x):
        scale = torch.ones(())
        for block in self.blocks:
            if self.tied:
                scale = x.mean()
            x = block(x, scale)
        return x.square().sum()


@pytest.mark.slow  # the default suite's time budget: run with -m slow
def test_the_block_is_traced_for_its_schema_a_fixed_number_of_times(monkeypatch):
    """torch's autograd rule for `invoke_subgraph` re-traces the block at every call to
    check that it does not write its inputs; inside the backend that happens once per
    block and pass (`scan.schema_checked_once`), however many layers call it."""
    hop_type, counts = type(scan.INVOKE_SUBGRAPH), []
    generate = hop_type.gen_schema
    for layers in (2, 4):
        calls = []

        def counting(self, *args, calls=calls):
            calls.append(args[1])
            return generate(self, *args)

        monkeypatch.setattr(hop_type, "gen_schema", counting)
        torch._dynamo.reset()
        config = LlamaConfig(layers=layers, checkpoint="full")
        torch.manual_seed(0)
        train(LlamaLM(config), "tpu", True, batches(config)[:1])
        counts.append(len(calls))
    assert counts[0] == counts[1] and counts[0] <= 4, counts


@pytest.mark.parametrize("tied", [True, False], ids=["unscannable", "scannable"])
def test_blocks_that_cannot_be_scanned_run_unrolled_and_say_why(tied, tmp_path):
    torch.manual_seed(0)
    model = Stack(tied=tied)
    x = torch.randn(4, 8)
    reference = copy.deepcopy(model)
    expected = reference(x)
    expected.backward()
    device_model = copy.deepcopy(model).to("tpu")
    tpu_compile.scan_layers(device_model.blocks)
    with warnings.catch_warnings(record=True) as caught, tpu_compile.dump(tmp_path):
        warnings.simplefilter("always")
        loss = torch.compile(device_model, backend="tpu")(x.to("tpu"))
        loss.backward()
    said = [str(w.message) for w in caught if "compiled unrolled" in str(w.message)]
    forward = programs_text(tmp_path)["forward"]
    if tied:
        assert said and "computed from the output of another" in said[0]
        assert "stablehlo.while" not in forward
    else:
        assert not said
        assert forward.count("stablehlo.while") == 1
    # the blocks' tanh: a TPU's is up to 8e-5 relative from CPU's
    rtol, atol = chip.tolerance("transcendentals", cpu=(RTOL, ATOL), tpu=(1e-3, 1e-4))
    torch.testing.assert_close(loss.cpu(), expected, rtol=rtol, atol=atol)
    for (name, p), q in zip(reference.named_parameters(), device_model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=rtol, atol=atol, msg=name)


def test_one_marked_block_is_a_plain_call():
    torch.manual_seed(0)
    model = Stack(layers=1, tied=False)
    x = torch.randn(4, 8)
    expected = copy.deepcopy(model)(x)
    tpu_compile.scan_layers(model.blocks)
    assert torch.compile(model.to("tpu"), backend="tpu")(x.to("tpu")).item() == pytest.approx(expected.item(), rel=RTOL)


def test_marking_keeps_eager_and_can_be_undone():
    torch.manual_seed(0)
    model = Stack(tied=False)
    x = torch.randn(4, 8)
    expected = model(x)
    tpu_compile.scan_layers(model.blocks)
    assert all(scan.is_marked(block) for block in model.blocks)
    assert isinstance(model.blocks[0], Scaled)
    assert torch.equal(model(x), expected)
    tpu_compile.unmark(model.blocks)
    assert type(model.blocks[0]) is Scaled
    with pytest.raises(TypeError, match="nn.Module"):
        tpu_compile.scan_layers([lambda x: x])


class Caching(nn.Module):
    """A decoder layer's shape of state: each call writes its input into a cache at a
    position (`index_copy_`, as transformers' static KV cache does) and into a slice of a
    second buffer, and reads both back."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, cache, window, position):
        cache.index_copy_(1, position, self.linear(x)[:, None])
        window[:, :2].copy_(x[:, :2] * 2)
        return x + torch.tanh(cache.sum(1)) + window.sum(1, keepdim=True)


class CachingStack(nn.Module):
    def __init__(self, layers: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(Caching() for _ in range(layers))

    def forward(self, x, caches, windows, position):
        for block, cache, window in zip(self.blocks, caches, windows):
            x = block(x, cache, window[:, 1:5], position)  # a slice of the buffer: a view is written
        return x


def test_blocks_that_write_their_inputs_write_them_as_in_eager():
    """A marked block that writes its inputs reaches the backend as
    `auto_functionalized_v2(invoke_subgraph)`: the writes (a whole cache and a slice of
    another buffer) land in the caller's tensors, step after step, as in eager."""
    torch.manual_seed(0)
    model = CachingStack()
    state = lambda device: ([torch.zeros(4, 5, 8, device=device) for _ in range(3)],
                            [torch.zeros(4, 7, device=device) for _ in range(3)])  # fmt: skip
    x = torch.randn(4, 8)
    caches, windows = state("cpu")
    expected = [model(x, caches, windows, torch.tensor([p])) for p in range(3)]
    device_model = copy.deepcopy(model).to("tpu")
    tpu_compile.scan_layers(device_model.blocks)
    step = torch.compile(device_model, backend="tpu")
    on_device, device_windows = state("tpu")
    with torch.no_grad():
        got = [step(x.to("tpu"), on_device, device_windows, torch.tensor([p]).to("tpu")) for p in range(3)]
    rtol, atol = chip.tolerance("transcendentals", cpu=(RTOL, ATOL), tpu=(1e-3, 1e-4))
    for p, (a, b) in enumerate(zip(expected, got)):
        torch.testing.assert_close(b.cpu(), a.detach(), rtol=rtol, atol=atol, msg=f"output of call {p}")
    for name, a, b in [("cache", caches, on_device), ("window", windows, device_windows)]:
        for layer, (u, v) in enumerate(zip(a, b)):
            torch.testing.assert_close(v.cpu(), u, rtol=rtol, atol=atol, msg=f"{name} of layer {layer}")


@pytest.mark.parametrize("returned", [1, 3])
def test_a_stack_is_returned_for_its_rows_only_when_most_of_them_are_outputs(returned):
    # rows.py: returning a stack keeps all of it alive, so a program returning one row of
    # a 4-row stack returns that row as a plain array, and three rows as rows of the stack
    from tpu_backend.compile import rows
    from tpu_backend.compile.program import Program

    def fn(*xs):
        stacked = jnp.stack(xs) * 2.0
        outs = []
        for k in range(returned):
            out = stacked[k]
            rows.note(out, stacked, k)
            outs.append(out)
        return outs

    xs = [jnp.full((8, 128), float(k)) for k in range(4)]
    outputs = Program(f"rows_{returned}", fn, rows_as_views=True)(*xs)
    for k, out in enumerate(outputs):
        if returned == 1:
            assert isinstance(out, jax.Array) and out.shape == (8, 128)
            value = out
        else:
            assert isinstance(out, rows.Row) and out.base.shape == (4, 8, 128) and out.index == k
            value = out.base[out.index]
        np.testing.assert_array_equal(np.asarray(value), np.full((8, 128), 2.0 * k))
