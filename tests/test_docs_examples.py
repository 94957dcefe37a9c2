"""The python examples of the README, docs/tutorial.md and the user guides (docs/export.md,
docs/device.md) run, as written, on small models.

Every ```python block of those files is found here by a phrase it contains (`BLOCKS`)
and run in a fresh namespace holding the names the prose leaves to the reader (`model`,
`x`, `samples`, ...: small models and inputs, built by the block's setup), in a temporary
working folder. A block no entry matches fails the test: a new example gets a setup (or a
stated reason not to run) when it is written, and an edited one that no longer runs fails
here instead of in a reader's hands. The quickstart's figures are checked against the
example's own run in tests/examples/test_examples.py.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "docs/tutorial.md", "docs/export.md", "docs/device.md")


def python_blocks(path: str) -> list[str]:
    """The ```python blocks of a markdown file (fences indented in lists included), dedented."""
    blocks, current, fence = [], None, None
    with open(os.path.join(ROOT, path)) as f:
        for line in f:
            if current is None:
                match = re.match(r"^(\s*)```python\s*$", line)
                if match:
                    current, fence = [], match.group(1) + "```"
            elif line.rstrip() == fence:
                blocks.append(textwrap.dedent("".join(current)))
                current = None
            else:
                current.append(line)
    return blocks


# --------------------------------------------------------------------------- the reader's names


class MyModel(nn.Module):
    """A small image classifier: what `MyModel` / `model` stand for in the README."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.classifier = nn.Linear(32, 10)

    def forward(self, x):
        return self.classifier(F.relu(self.conv(x)).mean((2, 3)))


def _images(n, seed, size=16):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, size, size, generator=g) for _ in range(n)]


def _image_model():
    torch.manual_seed(0)
    x = _images(1, 0)[0]
    samples = [(t,) for t in _images(8, 1)]
    return {"MyModel": MyModel, "model": MyModel().eval(), "x": x, "samples": samples}


def _quantization():
    from tests.converter.quantize.test_pt2e import ConvertedPT2E

    names = _image_model()
    names["calibration_batches"] = _images(8, 2)
    names["calibration"] = names["samples"]
    names["eval_data"] = [(t,) for t in _images(4, 3)]
    names["pt2e_model"] = ConvertedPT2E().eval()
    return names


class TokenModel(nn.Module):
    def __init__(self, width=768):
        super().__init__()
        self.embed = nn.Embedding(100, width)

    def forward(self, ids):
        return self.embed(ids)


def _dynamic():
    g = torch.Generator().manual_seed(0)
    return {
        "model": TokenModel().eval(),
        "ids": torch.randint(0, 100, (2, 8), generator=g),
        "ids_of_any_batch_and_length": torch.randint(0, 100, (3, 21), generator=g),
    }


def _check_signature_comment(block, names):
    """The comment after `edge.signatures[0]` is what it prints."""
    shown = re.search(r"^edge\.signatures\[0\]\s+#\s*(.+)$", block, re.M).group(1)
    assert repr(names["edge"].signatures[0]) == shown


def _signatures():
    torch.manual_seed(0)
    return {"encoder": nn.Linear(16, 4), "decoder": nn.Linear(4, 16), "x": torch.randn(2, 16), "z": torch.randn(2, 4)}


def _prompt():
    return {"prompt_ids": [1, 5, 9, 3]}


def _check_generated(block, names):
    assert len(names["new_ids"]) == 20 and all(isinstance(t, int) for t in names["new_ids"])


def _one_call():
    """A tiny Llama and a left-padded batch of two prompts, as its tokenizer would give them."""
    from benchmarks.families.causal_lm import build

    ids = torch.tensor([[0, 0, 5, 9, 3], [4, 8, 1, 7, 2]])
    model = build("llama")
    model.config.max_position_embeddings = 256  # the block's cache_len (rotary tables are computed per call)
    return {"model": model, "inputs": {"input_ids": ids, "attention_mask": (ids != 0).long()}}


def _check_one_call(block, names):
    with torch.no_grad():
        want = names["model"].generate(**names["inputs"], max_new_tokens=20)
    assert names["ids"].tolist() == want.tolist()


def _web():
    from runtimes.web import web_unavailable

    if web_unavailable() is not None:
        pytest.skip(str(web_unavailable()))
    return {"token_model": nn.Embedding(16, 4).eval(), "ids": torch.tensor([[3, 0, 15]])}


def _training():
    g = torch.Generator().manual_seed(0)
    loader = [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(2)]
    return {"MyModel": MyModel, "loader": loader, "litert_torch": __import__("litert_torch")}


def _on_device():
    import tpu_backend  # noqa: F401

    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16).to("tpu")
    return {
        "model": MyModel().to("tpu"),
        "x": x,
        "y": torch.tensor([1, 2]).to("tpu"),
        "weight": torch.ones(16).to("tpu"),
        "r": torch.randn(2, 3, 16, 16).to("tpu"),
        "F": F,
    }


def _train_step_readme():
    """The README's `TrainStep` block: its image model on the device, its AdamW, its loader."""
    import tpu_backend

    torch.manual_seed(0)
    model = MyModel().to("tpu")
    names = {"model": model, "opt": torch.optim.AdamW(model.parameters()), "tpu_backend": tpu_backend, "F": F}
    return {**_training(), **names}  # the names of the README block above it


def _train_step_llama():
    """docs/device.md's `TrainStep` block: a model with repeated layers (remat), token batches."""
    import tpu_backend
    from benchmarks.models import LlamaConfig, LlamaLM, sequence_loss

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    loader = [(torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g))]
    model = LlamaLM(LlamaConfig(layers=2)).to("tpu")
    return {"model": model, "loss_fn": sequence_loss, "loader": loader, "tpu_backend": tpu_backend}


class TokensAndLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(64, 32), nn.Linear(32, 64)

    def forward(self, tokens, targets):
        return F.cross_entropy(self.head(self.embed(tokens)).flatten(0, 1), targets.flatten())


def _program_export():
    import tpu_backend

    g = torch.Generator().manual_seed(0)
    return {
        "tpu_backend": tpu_backend,
        "model_and_loss": TokensAndLoss(),
        "tokens": torch.randint(0, 64, (2, 16), generator=g),
        "targets": torch.randint(0, 64, (2, 16), generator=g),
    }


def _jax_op():
    import jax

    import tpu_backend  # noqa: F401

    return {"jax": jax, "x_tpu": torch.randn(8).to("tpu").requires_grad_(), "step": lambda: None}


def _digits():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from digits_cnn import DigitsResNet

    g = torch.Generator().manual_seed(0)
    return {
        "DigitsResNet": DigitsResNet,
        "x_test": torch.rand(4, 1, 8, 8, generator=g),
        "x_train": torch.rand(128, 1, 8, 8, generator=g),
    }


def _tiny_llama_on_device():
    import tpu_backend  # noqa: F401
    from litert_torch.generative import TinyLlama, TinyLlamaConfig

    torch.manual_seed(0)
    model = TinyLlama(TinyLlamaConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=1)).to("tpu")
    return {"model": model, **_prompt()}


def _checkpoint():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    transformers.LlamaForCausalLM(config).save_pretrained("my_checkpoint")
    return {}


def _diffusion():
    from litert_torch.generative.diffusion import TINY_SD_CONFIGS, pipeline_from_configs

    g = torch.Generator().manual_seed(0)
    return {
        "pipe": pipeline_from_configs(**TINY_SD_CONFIGS),
        "prompt_ids": torch.randint(0, 1000, (1, 16), generator=g),
        "negative_prompt_ids": torch.randint(0, 1000, (1, 16), generator=g),
        "noise": torch.randn(1, 4, 8, 8, generator=g),
    }


def _check_diffusion(block, names):
    assert names["image"].shape == (16, 16, 3)
    assert abs(names["image"] - names["expected"]).max() <= 1e-3


def _vlms():
    import transformers

    from benchmarks.families.vlm import IMAGE, gemma3_vlm, prompt_with_images, smolvlm

    small = smolvlm()
    small.config.text_config.max_position_embeddings = 512  # the block's cache_len
    return {
        "gemma3": gemma3_vlm(),
        "smolvlm": small,
        "pixel_values": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)),
        "prompt_ids": prompt_with_images(1, text_before=3, text_after=2),
        "image": torch.rand(3, 48, 64, generator=torch.Generator().manual_seed(1)),
        "transformers": transformers,
        "_image_id": IMAGE,
    }


def _check_vlm_generated(block, names):
    assert len(names["new_ids"]) == 20 and names["pixel_values"].shape == (5, 3, 32, 32)


def _embedder():
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=2048, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    return {"BertModel": lambda config: transformers.BertModel(config, add_pooling_layer=False), "config": config}


def _check_embeddings(block, names):
    vectors = names["vectors"]
    assert vectors.shape == (2, 32) and abs(float((vectors**2).sum(-1).max()) - 1) < 1e-5


def _seq2seq():
    import transformers

    from benchmarks.families.seq2seq import FAMILIES, build, source_for

    t5 = build("t5")
    torch.manual_seed(0)
    whisper_config = transformers.WhisperConfig(**dict(FAMILIES["whisper"][2], max_target_positions=64))
    whisper = transformers.WhisperForConditionalGeneration(whisper_config).eval()
    return {
        "t5_model": t5,
        "whisper_model": whisper,
        "source_ids": source_for(t5),
        "input_features": source_for(whisper),
    }


def _check_seq2seq_generated(block, names):
    assert len(names["new_ids"]) == 20


def _image_to_text():
    from benchmarks.families.image_to_text import build, image_for

    trocr = build("trocr (vit + trocr)")
    return {"trocr_model": trocr, "pixel_values": image_for(trocr)}


def _lora_on_device():
    import transformers

    import tpu_backend  # noqa: F401
    from litert_torch.generative import export_generative

    _checkpoint()
    return {
        "folder": "my_checkpoint",
        "AutoModelForCausalLM": transformers.AutoModelForCausalLM,
        "export_generative": export_generative,
    }


def _check_merged_export(block, names):
    """The exported merge generates the merged model's greedy tokens."""
    from litert_torch.generative import generate, reference_generate

    prompt = torch.tensor([1, 5, 9, 3])
    expected = reference_generate(names["merged"].to("cpu").eval(), prompt, 8)
    assert list(generate(names["edge"], prompt, 8)) == list(expected)


SKIP = "not run here"
# (file, a phrase of the block, setup -> names | reason it does not run, check after the run)
BLOCKS = [
    ("README.md", 'edge.export("model.tflite")  # atomic write', _image_model, None),
    ("README.md", "opt = torch.optim.AdamW", _training, None),
    ("README.md", "tpu_backend.TrainStep(model, F.cross_entropy, opt)", _train_step_readme, None),
    ("README.md", "# sizes read from the sample", _one_call, _check_one_call),
    ("docs/export.md", 'edge.export("model.tflite")  # atomic write', _image_model, None),
    ("docs/export.md", "from transformers import LlamaConfig", dict, None),
    ("docs/export.md", 'Dim("batch", min=1, max=64)', _dynamic, _check_signature_comment),
    ("docs/export.md", 'litert_torch.signature("encode"', _signatures, None),
    ("docs/export.md", "padding=True, return_tensors", _one_call, _check_one_call),
    ("docs/export.md", "export_generative(model, prefill_len=32", _prompt, _check_generated),
    ("docs/export.md", "export_diffusion(pipe)", _diffusion, _check_diffusion),
    ("docs/export.md", "export_vlm(gemma3", _vlms, _check_vlm_generated),
    ("docs/export.md", "export_embedder(BertModel(config)", _embedder, _check_embeddings),
    ("docs/export.md", "export_seq2seq(t5_model", _seq2seq, _check_seq2seq_generated),
    ("docs/export.md", "export_image_to_text(trocr_model", _image_to_text, _check_seq2seq_generated),
    ("docs/export.md", "quantize.weight_only_int4(32)", _quantization, None),
    ("docs/export.md", "quantize.analyze(", _quantization, None),
    ("docs/export.md", 'target="android-cpu"', _image_model, None),
    ("docs/export.md", 'target="android-gpu"', _image_model, None),
    ("docs/export.md", 'target="web"', _web, None),
    ("docs/export.md", "export_c_source(", _image_model, None),
    ("docs/export.md", 'target="edgetpu"', _image_model, None),
    ("docs/device.md", "opt = torch.optim.AdamW", _training, None),
    ("docs/device.md", "tpu_backend.TrainStep(model, loss_fn", _train_step_llama, None),
    ("docs/device.md", "grad_and_value", _on_device, None),
    ("docs/device.md", 'kernels.use("interpret")', _on_device, None),
    ("docs/device.md", "tpu_backend.export(model_and_loss", _program_export, None),
    ("docs/device.md", 'torch.tpu.jax_op("mylib::swish")', _jax_op, None),
    (
        "docs/device.md",
        "dist.init_mesh((8,)",
        f"{SKIP}: needs 8 devices and a data loader (tests/tpu_backend/distributed runs the API)",
        None,
    ),
    (
        "docs/device.md",
        'dist.init_process_group("tpu")',
        f"{SKIP}: needs a torchrun launch (examples/llama_fsdp_tp.py)",
        None,
    ),
    (
        "docs/device.md",
        "Trainer(model, args, train_dataset=train",
        f"{SKIP}: a full Trainer run; tests/tpu_backend/test_trainer_integration.py runs each argument against CPU",
        None,
    ),
    ("docs/device.md", "peft.get_peft_model(model", _lora_on_device, _check_merged_export),
    ("docs/tutorial.md", "DigitsResNet().to(", _digits, None),
    ("docs/tutorial.md", "export_generative(model, prefill_len=16", _tiny_llama_on_device, None),
    ("docs/tutorial.md", "from_pretrained(", _checkpoint, None),
]


def _entry(doc, block):
    matches = [entry for entry in BLOCKS if entry[0] == doc and entry[1] in block]
    assert len(matches) == 1, (
        f"{doc}: {len(matches)} entries of BLOCKS (tests/test_docs_examples.py) match this block; give it exactly one:\n{block}"
    )
    return matches[0]


def test_every_python_block_has_an_entry():
    for doc in DOCS:
        for block in python_blocks(doc):
            _entry(doc, block)
    found = {
        (doc, phrase) for doc in DOCS for block in python_blocks(doc) for d, phrase, *_ in BLOCKS if phrase in block
    }
    stale = [(doc, phrase) for doc, phrase, *_ in BLOCKS if (doc, phrase) not in found]
    assert not stale, f"entries whose block is gone: {stale}"


@pytest.fixture
def restore_global_settings():
    """Blocks switch process-wide settings (kernel mode, matmul precision): put them back."""
    precision = torch.get_float32_matmul_precision()
    from tpu_backend import kernels

    mode = kernels.mode()
    yield
    kernels.set_mode(mode)
    torch.set_float32_matmul_precision(precision)


CASES = [(doc, i, block) for doc in DOCS for i, block in enumerate(python_blocks(doc))]


@pytest.mark.parametrize("doc, index, block", CASES, ids=[f"{doc}-{i}" for doc, i, _ in CASES])
def test_python_block_runs(doc, index, block, tmp_path, monkeypatch, restore_global_settings):
    _, _, setup, check = _entry(doc, block)
    if isinstance(setup, str):
        pytest.skip(setup)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LITERT_TORCH_PROGRESS", "0")
    import litert_torch
    from litert_torch import quantize

    # what the README's earlier blocks import, as a reader has it from there on
    imported = {"torch": torch, "litert_torch": litert_torch, "quantize": quantize}
    names = {"__name__": f"docs_example_{index}", **imported, **setup()}
    exec(compile(block, f"{doc} python block {index}", "exec"), names)  # noqa: S102
    if check is not None:
        check(block, names)
