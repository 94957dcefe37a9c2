"""Dynamic shapes under `torch.compile(backend="tpu")`: sizes padded to buckets, a bounded
number of programs, results equal to unpadded PyTorch (tpu_backend/compile/dynamic.py)."""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.nn import functional as F

import tpu_backend  # noqa: F401  (registers the device)
import tpu_backend.compile as tpu_compile
from benchmarks.models import TinyLM, token_batches
from tests import chip
from tests.tpu_backend.parity import assert_runs_match, record_training
from tpu_backend.compile.dynamic import BucketedProgram, Buckets, ExactShapesWarning

LENGTHS = (5, 7, 3, 6)  # buckets (powers of two): 8, 8, 4, 8
MORE_LENGTHS = (5, 7, 3, 8, 6, 11, 2, 13, 16, 9)  # buckets 2, 4, 8, 16
# On a TPU: its float32 exp/tanh/log approximations (up to 8e-5 relative, docs/tpu.md).
TOLERANCE = chip.tolerance("transcendentals", cpu=1e-5, tpu=2e-4)


@pytest.fixture(autouse=True)
def _fresh_dynamo(fresh_dynamo):
    """Every test here starts from a fresh Dynamo and zero compile counts (conftest.py),
    with every size padded to its power of two: the default policy's first two sizes of
    each symbol run unpadded (`test_the_full_batches_after_a_smaller_last_one_run_unpadded`)."""
    with tpu_compile.dynamic.using_buckets(Buckets.powers_of_two(exact_first=0)):
        yield


def compiled_signatures(kind: str) -> int:
    """How many programs (one XLA executable per signature) of this kind were built."""
    stats = tpu_compile.compile_stats().programs
    return sum(s.misses + s.disk_hits for name, s in stats.items() if name.endswith(kind))


def bucketed_programs() -> list[BucketedProgram]:
    """The bucketed programs this test compiled (other tests' programs may still be alive)."""
    compiled_here = set(tpu_compile.compile_stats().programs)
    return [p for p in tpu_compile.programs() if isinstance(p, BucketedProgram) and p.name in compiled_here]


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 5))


def variable_batches(lengths=LENGTHS):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 8, generator=generator), torch.randint(0, 5, (n,), generator=generator)) for n in lengths]


def train(model, batches, compile_options=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_of = lambda x, y: F.cross_entropy(model(x), y)
    if compile_options is not None:
        loss_of = torch.compile(loss_of, backend="tpu", dynamic=True, options=compile_options or None)

    def step(x, y):
        optimizer.zero_grad()
        loss = loss_of(x, y)
        loss.backward()
        optimizer.step()
        return loss

    return record_training(model, step, batches)


@pytest.mark.parametrize("lengths", [pytest.param(MORE_LENGTHS, marks=pytest.mark.slow)])
def test_variable_batch_training_compiles_one_program_per_bucket_and_matches_cpu(lengths):
    batches = variable_batches(lengths)
    want = train(classifier(), batches)
    device_batches = [(x.to("tpu"), y.to("tpu")) for x, y in batches]
    got = train(classifier().to("tpu"), device_batches, compile_options={})

    assert_runs_match(got, want, "variable batch, bucketed")
    buckets = {Buckets.powers_of_two()(n) for n in lengths}
    assert compiled_signatures("_forward") == len(buckets)
    assert compiled_signatures("_backward") == len(buckets)
    assert all(not p.plan.pinned for p in bucketed_programs())


def test_the_full_batches_after_a_smaller_last_one_run_unpadded(monkeypatch):
    """A training set whose size is not a multiple of the batch ends each epoch with a
    smaller batch; Dynamo then compiles the batch dim as a symbol, and the full batches of
    the next epochs ran in that program padded to a power of two (5 rows as 8). The default
    policy runs the first two sizes of each symbol at their own size; a third is bucketed."""
    sizes = []
    padded_sizes = BucketedProgram.padded_sizes
    monkeypatch.setattr(
        BucketedProgram, "padded_sizes", lambda self, true: sizes.append(padded_sizes(self, true)) or sizes[-1]
    )
    batches = variable_batches((5, 5, 2, 5, 5, 3))
    model, cpu_model = classifier().to("tpu"), classifier()
    step = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend="tpu")  # automatic dynamic shapes
    with tpu_compile.dynamic.using_buckets(Buckets.powers_of_two()):
        for x, y in batches:
            step(x.to("tpu"), y.to("tpu")).backward()
            F.cross_entropy(cpu_model(x), y).backward()
    for got, want in zip(model.parameters(), cpu_model.parameters()):  # gradients summed over the six
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=TOLERANCE, atol=TOLERANCE)
    rows = [set(padded.values()) for padded in sizes[::2]]  # (forward, backward) per call
    assert rows == [{2}, {5}, {5}, {4}]  # the first two in the static program


def test_user_buckets_and_sizes_beyond_them():
    model = classifier()
    compiled = torch.compile(model, backend="tpu", dynamic=True, options={"buckets": [16]})
    with torch.no_grad():
        for x, _ in variable_batches((3, 9, 16, 20, 21)):
            torch.testing.assert_close(compiled(x), model(x), rtol=TOLERANCE, atol=TOLERANCE)
    # 3, 9, 16 share the bucket 16; 20 and 21 are beyond the largest bucket: exact programs.
    assert compiled_signatures("_inference") == 3


def test_mark_dynamic_is_accepted_and_bucketed():
    model = classifier()
    compiled = torch.compile(model, backend="tpu")
    with torch.no_grad(), tpu_compile.dynamic.using_buckets([8, 32]):
        for n in (5, 6, 7, 20):
            x = torch.randn(n, 8)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), model(x), rtol=TOLERANCE, atol=TOLERANCE)
    assert compiled_signatures("_inference") == 2
    (program,) = bucketed_programs()
    exported = program.export(platforms=("tpu",))  # each bucket's program lowers for a TPU
    shapes = [{a.shape for a in e.in_avals} for e in exported]
    assert sorted(bucket for bucket in (8, 32) for s in shapes if (bucket, 8) in s) == [8, 32]


def attention_pool(x):
    """Softmax, mean, sum and a contraction all over the symbolic dim 0."""
    scores = torch.softmax(x @ x.T / 4, dim=-1)
    mixed = scores @ x
    return mixed.mean(dim=0) + torch.log_softmax(x, dim=0).sum(0) + x.amax(0)


def test_reductions_over_a_padded_dim_are_masked():
    compiled = torch.compile(attention_pool, backend="tpu", dynamic=True)
    for n in (5, 6, 7):
        x = torch.randn(n, 4, requires_grad=True)
        got = compiled(x)
        (grad,) = torch.autograd.grad(got.sum(), x)
        want = attention_pool(x)
        (want_grad,) = torch.autograd.grad(want.sum(), x)
        torch.testing.assert_close(got, want, rtol=TOLERANCE, atol=TOLERANCE)
        torch.testing.assert_close(grad, want_grad, rtol=TOLERANCE, atol=TOLERANCE)
    assert compiled_signatures("_forward") == 1  # bucket 8


def reversed_rows(x):
    return x.flip(0) * 2


def test_ops_padding_could_change_fall_back_to_exact_shapes():
    compiled = torch.compile(reversed_rows, backend="tpu", dynamic=True)
    with pytest.warns(ExactShapesWarning, match="flip"):
        for n in (3, 5, 6):
            x = torch.randn(n, 4)
            torch.testing.assert_close(compiled(x), reversed_rows(x), rtol=TOLERANCE, atol=TOLERANCE)
    assert compiled_signatures("_inference") == 3  # one per size: flip would move padding to the front


def with_positions(x):
    return x + torch.arange(x.shape[1], device=x.device)  # HF models' cache positions


def reversed_with_positions(x):
    return x.flip(1) + torch.arange(x.shape[1], device=x.device)


@pytest.mark.parametrize("fn,programs", [(with_positions, 2), (reversed_with_positions, 3)], ids=["bucketed", "exact"])
def test_arange_of_a_symbolic_size(fn, programs):
    """`torch.arange(s)` makes s positions: padded to the bucket, or exact where `flip` pins s
    (both failed with "Abstract tracer value encountered" before: the length was traced)."""
    compiled = torch.compile(fn, backend="tpu", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExactShapesWarning)
        for n in (3, 5, 6):
            x = torch.randn(2, n)
            torch.testing.assert_close(compiled(x.to("tpu")).cpu(), fn(x), rtol=0, atol=0)
    assert compiled_signatures("_inference") == programs  # buckets 4 and 8, or one per length


def test_graph_constants_are_embedded_so_a_second_length_runs():
    """A sliding-window model (Mistral) keeps graph constants (its cache's empty tensors) in
    the program: embedded as values. Held as jax.Arrays they became extra inputs of the
    executable that `lower().compile()` lost: "Computation compiled for 32 inputs but called
    with 26" at the second length."""
    import transformers

    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config).eval()
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ExactShapesWarning)  # pinned: index along the sequence
        for length in (5, 7):
            ids = torch.randint(0, 64, (2, length))
            ids_tpu = ids.to("tpu")
            torch._dynamo.maybe_mark_dynamic(ids_tpu, 1)
            got = compiled(input_ids=ids_tpu).logits.cpu()
            torch.testing.assert_close(got, model(input_ids=ids).logits, rtol=TOLERANCE, atol=TOLERANCE)


def packed_attention(x, w):
    q, k, v = (x @ w).unflatten(-1, (3, 2, 8)).permute(2, 0, 3, 1, 4)  # select along the packed dim
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return (out * torch.linspace(-1, 1, 8, device=x.device)).sum()


def test_attention_training_over_a_symbolic_batch_is_bucketed():
    """sdpa's safe softmax over the keys and the backwards of `select`/`slice` along other
    dims are row-local along the batch: no exact shapes, gradients equal CPU's."""
    torch.manual_seed(0)
    w = torch.randn(16, 48) * 0.3
    compiled = torch.compile(packed_attention, backend="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExactShapesWarning)
        for batch in (3, 5, 6):
            x = torch.randn(batch, 8, 16)
            w_cpu, w_tpu = w.clone().requires_grad_(), w.to("tpu").requires_grad_()
            packed_attention(x, w_cpu).backward()
            x_tpu = x.to("tpu")
            torch._dynamo.mark_dynamic(x_tpu, 0)
            compiled(x_tpu, w_tpu).backward()
            torch.testing.assert_close(w_tpu.grad.cpu(), w_cpu.grad, rtol=TOLERANCE, atol=TOLERANCE)
    assert compiled_signatures("_forward") == 2  # buckets 4 and 8
    assert compiled_signatures("_backward") == 2


def test_a_hugging_face_llama_forward_is_bucketed_over_sequence_lengths():
    """What a causal LM's forward does with the length: cache positions (`arange`), a cache
    that starts empty (`cat` with an empty tensor), a mask of ones made triangular (`tril`),
    sdpa's safe softmax. All row-local or masked: one program per bucket, logits as CPU's."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", ExactShapesWarning)
        for length in (5, 7, 3, 9):
            ids = torch.randint(0, 64, (2, length))
            ids_tpu = ids.to("tpu")
            torch._dynamo.mark_dynamic(ids_tpu, 1)
            got = compiled(input_ids=ids_tpu).logits.cpu()
            torch.testing.assert_close(got, model(input_ids=ids).logits, rtol=TOLERANCE, atol=TOLERANCE)
    assert compiled_signatures("_inference") == 3  # buckets 8, 4 and 16


@pytest.mark.parametrize("kernels", ["off", "interpret"])
def test_variable_length_sequence_training_is_bucketed_and_matches_cpu(kernels):
    """With the kernels (as on a TPU) too: their norm and cross-entropy are row-local, and
    the backward pads the flattened targets it gets from the forward where the forward's
    reshape put their padding (a misaligned target was 1 / count off in a row's gradient)."""

    def train_lm(model, batches, compiled):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_of = lambda ids, targets: F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
        if compiled:
            loss_of = torch.compile(loss_of, backend="tpu")

        def step(ids, targets):
            torch._dynamo.mark_dynamic(ids, 1)  # the sequence length varies
            torch._dynamo.mark_dynamic(targets, 1)
            optimizer.zero_grad()
            loss = loss_of(ids, targets)
            loss.backward()
            optimizer.step()
            return loss

        return record_training(model, step, batches)

    batches = token_batches((5, 7, 3, 6))
    want = train_lm(TinyLM(), batches, compiled=False)
    with tpu_backend.kernels.use(kernels), warnings.catch_warnings():
        warnings.simplefilter("error", ExactShapesWarning)
        got = train_lm(TinyLM().to("tpu"), [(i.to("tpu"), t.to("tpu")) for i, t in batches], compiled=True)

    assert_runs_match(got, want, "variable sequence length, bucketed")
    assert compiled_signatures("_forward") <= 2  # buckets 4 and 8 (lengths 5, 7, 3, 6)
    assert compiled_signatures("_backward") <= 2


def test_reshape_orders_that_disagree_fall_back_to_exact_shapes():
    def transposed_by_reshape(x):  # [2, s] flattened, then read as [s, 2]: rows mix with padding
        return x.reshape(-1).reshape(-1, 2).sum(1)

    compiled = torch.compile(transposed_by_reshape, backend="tpu")
    with pytest.warns(ExactShapesWarning, match="reshape"):
        for n in (3, 5):
            x = torch.randn(2, n)
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(compiled(x), transposed_by_reshape(x), rtol=TOLERANCE, atol=TOLERANCE)


def test_a_size_used_as_an_offset_is_not_padded():
    def last_two_rows(x):
        return x.narrow(0, x.shape[0] - 2, 2) * 3

    compiled = torch.compile(last_two_rows, backend="tpu", dynamic=True)
    with pytest.warns(ExactShapesWarning, match="narrow|slice|start"):
        for n in (3, 5, 6):
            x = torch.randn(n, 4)
            torch.testing.assert_close(compiled(x), last_two_rows(x), rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.slow  # 14 s; test_gpt2_trains_under_dynamic_true_as_on_cpu runs the same graph break with gradients
def test_a_loss_in_a_graph_of_its_own_pads_its_rows_alike():
    """GPT-2 breaks the graph before its loss: the logits' rows and the labels' rows enter
    that graph as separate symbols, equal only at run time, and the labels' padding op
    pins theirs. The logits were padded to the bucket and the labels not: "Incompatible
    shapes for broadcasting: (20, 1), (32, 1)" in nll_loss. A symbol whose true value a
    pinned one has is now exact too. Loss and logits as on CPU at three lengths."""
    from benchmarks.families import causal_lm as families

    model = families.build("gpt2")
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ExactShapesWarning)
        for length in (10, 13, 21):
            ids = torch.randint(0, families.VOCAB, (2, length), generator=torch.Generator().manual_seed(length))
            got, want = compiled(input_ids=ids.to("tpu"), labels=ids.to("tpu")), model(input_ids=ids, labels=ids)
            torch.testing.assert_close(got.loss.cpu(), want.loss, rtol=TOLERANCE, atol=TOLERANCE)
            torch.testing.assert_close(got.logits.cpu(), want.logits, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("rule", ["nll_loss's", "none: padding fails, exact shapes"])
def test_symbolic_labels_beside_logits_of_a_static_size_are_not_padded(rule, monkeypatch):
    """Labels whose sizes changed across calls (automatic dynamic shapes) beside logits
    whose sizes did not: `nll_loss` never makes Dynamo equate its target's rows with its
    input's, so the labels alone were padded ("Incompatible shapes for broadcasting:
    (32, 1), (24, 1)"), seen in a second Trainer of a process. Its rule keeps them exact;
    without it, the failed trace at padded sizes is traced again at exact ones. Loss and
    gradient as on CPU."""
    from tpu_backend.compile import dynamic

    if rule.startswith("none"):
        monkeypatch.setattr(dynamic, "_target_rows_as_input_rows", lambda *args: None)

    def loss_of(logits, labels):
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))

    compiled = torch.compile(loss_of, backend="tpu")
    for seed in (0, 1):
        generator = torch.Generator().manual_seed(seed)
        logits, labels = torch.randn(2, 12, 10, generator=generator), torch.randint(0, 10, (2, 12), generator=generator)
        on_tpu, labels_on_tpu = logits.to("tpu").requires_grad_(), labels.to("tpu")
        torch._dynamo.mark_dynamic(labels_on_tpu, 0)
        torch._dynamo.mark_dynamic(labels_on_tpu, 1)
        with pytest.warns(ExactShapesWarning, match="nll_loss") if seed == 0 else contextlib.nullcontext():
            got = compiled(on_tpu, labels_on_tpu)
            got.backward()
        want = logits.requires_grad_()
        loss_of(want, labels).backward()
        torch.testing.assert_close(got.detach().cpu(), loss_of(logits, labels).detach(), rtol=TOLERANCE, atol=TOLERANCE)
        torch.testing.assert_close(on_tpu.grad.cpu(), want.grad, rtol=TOLERANCE, atol=TOLERANCE)


def test_the_gradient_of_a_slice_from_a_symbolic_start_is_not_padded():
    """`x[:, -k:]` with `k` a size symbol: its backward (`slice_backward`) takes the start as
    an offset, which a padded value moves (the gradient landed in the last row only)."""

    def tail_rows(x, k):
        return (x[:, -k:] * 2).sum()

    compiled = torch.compile(tail_rows, backend="tpu", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExactShapesWarning)
        for n, k in ((5, 3), (7, 7), (9, 4)):
            x = torch.randn(2, n, 3, requires_grad=True)
            on_tpu = x.detach().to("tpu").requires_grad_()
            compiled(on_tpu, k).backward()
            tail_rows(x, k).backward()
            torch.testing.assert_close(on_tpu.grad.cpu(), x.grad, rtol=TOLERANCE, atol=TOLERANCE)


def test_gpt2_trains_under_dynamic_true_as_on_cpu():
    """GPT-2 keeps `hidden[:, -logits_to_keep:]` (logits_to_keep 0: every row), a symbolic
    start under `dynamic=True`; its gradient was padded as a size ("Incompatible types for
    broadcasting: float32[2,11,64] and [2,1,64]" in slice_backward). Loss and every
    gradient as on CPU at three lengths."""
    from benchmarks.families import causal_lm as families

    model = families.build("gpt2")
    device_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(device_model, backend="tpu", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExactShapesWarning)
        for length in (10, 13, 21):
            ids = torch.randint(0, families.VOCAB, (2, length), generator=torch.Generator().manual_seed(length))
            model.zero_grad(), device_model.zero_grad()
            want = model(input_ids=ids, labels=ids).loss
            got = compiled(input_ids=ids.to("tpu"), labels=ids.to("tpu")).loss
            want.backward(), got.backward()
            torch.testing.assert_close(got.cpu(), want, rtol=TOLERANCE, atol=TOLERANCE)
            for (name, expected), actual in zip(model.named_parameters(), device_model.parameters()):
                torch.testing.assert_close(actual.grad.cpu(), expected.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_bert_classification_over_padded_batches_of_any_length_is_bucketed_and_matches_cpu():
    """Text classification as Trainer's padding collator feeds it: each batch padded to its
    longest row, an attention mask with zeros. BERT reads its token types by position
    (`gather`), the masks index the attention mask with ranges (`index.Tensor`) and the pooler
    takes `hidden[:, 0]` (`select`, and `select_backward`): all read true positions of a dim
    padded at its end, so every length shares its bucket's programs (each compiled exactly
    per length before). A negative index (`hidden[:, -1]`) would read padding: pinned."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    generator = torch.Generator().manual_seed(2)
    batches = []
    for length in (9, 13, 11, 15):  # one bucket: 16
        ids = torch.randint(3, 64, (3, length), generator=generator)
        mask = torch.ones_like(ids)
        mask[0, length // 2 :] = 0  # a shorter row, padded
        batches.append(((ids, mask), torch.randint(0, 3, (3,), generator=generator)))

    def train_classifier(model, batches, compiled):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        forward = torch.compile(model, backend="tpu") if compiled else model

        def step(inputs, labels):
            optimizer.zero_grad()
            loss = forward(input_ids=inputs[0], attention_mask=inputs[1], labels=labels).loss
            loss.backward()
            optimizer.step()
            return loss

        return record_training(model, step, batches)

    want = train_classifier(copy.deepcopy(model), batches, compiled=False)
    on_device = [((i.to("tpu"), m.to("tpu")), y.to("tpu")) for (i, m), y in batches]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExactShapesWarning)
        got = train_classifier(copy.deepcopy(model).to("tpu"), on_device, compiled=True)
    assert_runs_match(got, want, "BERT over padded batches, bucketed")
    assert compiled_signatures("_forward") <= 2 and compiled_signatures("_backward") <= 2  # exact, then the bucket

    last_token = torch.compile(lambda h: h[:, -1].sum(), backend="tpu", dynamic=True)
    with pytest.warns(ExactShapesWarning, match="indexing into a symbolic dim"):
        assert last_token(torch.ones(2, 5, 4, device="tpu")).item() == 8.0


def test_causal_lm_training_over_padded_batches_of_any_length_is_bucketed_and_matches_cpu():
    """Fine-tuning as a padding collator feeds it: each batch padded to its longest row,
    padded labels at -100. transformers' causal-LM loss pads the labels by one and shifts
    them (`pad(labels, (0, 1), value=-100)[..., 1:]`: a dim of size s + 1, a slice from 1,
    and their backwards), which pinned the sequence: every new length compiled the forward
    and the backward again. Sizes `s + k` are padded at their end now, and that padding gets
    the pad value first. Losses, gradients and parameters as on CPU."""
    from tests.tpu_backend.test_trainer_integration import tiny_llama

    generator = torch.Generator().manual_seed(2)
    batches = []
    for length in (9, 13, 11, 15):  # one bucket: 16
        ids = torch.randint(3, 64, (3, length), generator=generator)
        mask = torch.ones_like(ids)
        mask[0, length // 2 :] = 0  # a shorter row, padded
        batches.append(((ids, mask), ids.masked_fill(mask == 0, -100)))

    def train_lm(model, batches, compiled):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        forward = torch.compile(model, backend="tpu", dynamic=True) if compiled else model

        def step(inputs, labels):
            optimizer.zero_grad()
            loss = forward(input_ids=inputs[0], attention_mask=inputs[1], labels=labels).loss
            loss.backward()
            optimizer.step()
            return loss

        return record_training(model, step, batches)

    want = train_lm(tiny_llama(), batches, compiled=False)
    on_device = [((i.to("tpu"), m.to("tpu")), y.to("tpu")) for (i, m), y in batches]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExactShapesWarning)
        got = train_lm(tiny_llama().to("tpu"), on_device, compiled=True)
    assert_runs_match(got, want, "a causal LM over padded batches, bucketed")
    assert compiled_signatures("_forward") == 1 and compiled_signatures("_backward") == 1


@pytest.mark.parametrize("pad", [(0, 2), (1, 0), (0, -1)], ids=str)
def test_constant_padding_and_prefix_sums_along_a_padded_dim(pad):
    """Padding after the true positions fills the padded ones with the value first (they
    were zeros: the sum would miss the -1s), padding before shifts them whole, cropping the
    end crops padding first; a cumulative sum reads positions up to its own."""

    def padded_then_summed(x):
        padded = F.pad(x, pad, value=-1.0)
        return padded.cumsum(-1)[..., 1:] * 2, padded.sum(-1)

    compiled = torch.compile(padded_then_summed, backend="tpu")  # (dynamic=True: the pads would be symbols)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExactShapesWarning)
        for n in (5, 7, 6):
            x = torch.randn(2, n)
            on_device = x.to("tpu")
            torch._dynamo.mark_dynamic(on_device, 1)
            for got, want in zip(compiled(on_device), padded_then_summed(x)):
                torch.testing.assert_close(got.cpu(), want, rtol=TOLERANCE, atol=TOLERANCE)
    assert compiled_signatures("_inference") == 1


def test_shifting_right_along_a_padded_dim_is_bucketed():
    """seq2seq models' decoder inputs: `new_zeros`, `shifted[:, 1:] = ids[:, :-1]`,
    `shifted[:, 0] = start` (`copy`, `slice_scatter`, `select_scatter` along the dim)."""

    def shift_right(ids):
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = 7
        return shifted * 2

    compiled = torch.compile(shift_right, backend="tpu", dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExactShapesWarning)
        for n in (5, 7, 6):
            ids = torch.randint(0, 50, (2, n))
            assert torch.equal(compiled(ids.to("tpu")).cpu(), shift_right(ids))
    assert compiled_signatures("_inference") == 1


@pytest.mark.slow  # 25 s; test_shifting_right_along_a_padded_dim_is_bucketed has its ops
def test_t5_training_over_padded_batches_of_any_length_is_bucketed_and_matches_cpu():
    """T5 makes its decoder inputs by shifting the labels right (`new_zeros`, then
    `shifted[:, 1:] = labels[:, :-1]` and `shifted[:, 0] = start`: `copy`, `slice_scatter`
    and `select_scatter` along the padded dim): they pinned both sequences. Encoder and
    decoder lengths change at every step here; gradients as on CPU."""
    import transformers

    config = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, decoder_start_token_id=0,
        dropout_rate=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(3)
    batches = []
    for length, target in ((9, 5), (13, 7), (11, 6)):  # buckets 16 and 8
        ids = torch.randint(3, 60, (2, length), generator=generator)
        mask = torch.ones_like(ids)
        mask[1, length - 3 :] = 0
        labels = torch.randint(3, 60, (2, target), generator=generator)
        labels[1, target - 2 :] = -100
        batches.append(((ids, mask), labels))

    def train_t5(model, batches, compiled):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        forward = torch.compile(model, backend="tpu", dynamic=True) if compiled else model

        def step(inputs, labels):
            optimizer.zero_grad()
            loss = forward(input_ids=inputs[0], attention_mask=inputs[1], labels=labels).loss
            loss.backward()
            optimizer.step()
            return loss

        return record_training(model, step, batches)

    want = train_t5(copy.deepcopy(model), batches, compiled=False)
    on_device = [((i.to("tpu"), m.to("tpu")), y.to("tpu")) for (i, m), y in batches]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExactShapesWarning)
        got = train_t5(copy.deepcopy(model).to("tpu"), on_device, compiled=True)
    assert_runs_match(got, want, "T5 over padded batches, bucketed")
    assert compiled_signatures("_forward") == 1 and compiled_signatures("_backward") == 1
