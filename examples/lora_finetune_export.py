"""Fine-tune a Llama or a Gemma with LoRA (PEFT) on "tpu", merge the adapters, export the
merged model to LiteRT and generate text that matches PyTorch token for token.

    .venv/bin/python examples/lora_finetune_export.py                   # Llama, 200 steps
    .venv/bin/python examples/lora_finetune_export.py --model gemma
    .venv/bin/python examples/lora_finetune_export.py --steps 8         # the quick form (CI)
    .venv/bin/python examples/lora_finetune_export.py --hidden-size 512 --layers 8 --heads 8 --rank 16

The flow a user copies, one call each:
1. `peft.get_peft_model(base, LoraConfig(...))` on a model already on "tpu": the adapters
   (`lora_A`, `lora_B` of every linear layer) follow their base layer to the device and
   are the only parameters that train;
2. an ordinary training loop (AdamW, with LoRA's dropout) over characters of seven
   Shakespeare sonnets (`examples/data/`, one token per character, as in `char_lm.py`);
3. `model.merge_and_unload()`: each adapter folded into its base weight, on the device;
4. `export_generative(merged, ...)`: one .tflite with `prefill` and `decode` signatures
   and an explicit KV cache, converted straight from the device;
5. `generate` in LiteRT against the merged model's own greedy loop in PyTorch (CPU).

The base stands in for a pretrained checkpoint: `LlamaForCausalLM` / `GemmaForCausalLM`
built from a small config with random weights (nothing downloads). With a real one, load it
with `AutoModelForCausalLM.from_pretrained(folder, device_map="tpu")` and keep the rest.
Printed: the loss, how far the merged model's logits are from the adapted model's, and
both continuations of a prompt with the largest logit difference over every step.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flow import cli, console, mean_loss, results_table, train  # noqa: E402
from char_lm import TEXT_PATH, CharTokenizer, NextTokenLoss, windows  # noqa: E402

from converter.pipeline import cpu_view  # noqa: E402
from litert_torch.generative import export_generative, generate, reference_generate  # noqa: E402
from runtimes.litert import max_relative_error  # noqa: E402

MODELS = ("llama", "gemma")


def base_model(name: str, vocab: int, *, hidden_size: int, layers: int, heads: int, context: int):
    """The model to fine-tune: a transformers causal LM from a small config (random weights)."""
    import transformers

    common = dict(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=context,
    )
    if name == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=False, **common))
    if name == "gemma":
        return transformers.GemmaForCausalLM(transformers.GemmaConfig(head_dim=hidden_size // heads, **common))
    raise ValueError(f"unknown model {name!r}; choose one of {MODELS}")


def run(
    model: str = "llama",
    steps: int = 200,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    rank: int = 8,
    alpha: int = 16,
    dropout: float = 0.05,
    batch_size: int = 16,
    length: int = 64,
    lr: float = 3e-3,
    new_tokens: int = 24,
    prompt: str = "Shall I compare thee",
    seed: int = 0,
) -> dict:
    import peft

    text = open(TEXT_PATH, encoding="utf-8").read()
    tokenizer = CharTokenizer(text)
    data = tokenizer.encode(text)
    context = 128
    torch.manual_seed(seed)
    base = base_model(
        model, len(tokenizer.chars), hidden_size=hidden_size, layers=layers, heads=heads, context=context
    ).to("tpu")
    lora = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear")
    lm = peft.get_peft_model(base, lora)
    trainable, total = lm.get_nb_trainable_parameters()
    losses = train(
        lm, windows(data, steps=steps, batch_size=batch_size, length=length, seed=seed), NextTokenLoss(), lr=lr
    )

    prompt_ids = tokenizer.encode(prompt)
    adapted = cpu_view(lm)  # the adapted model as trained, before merging (a CPU copy)
    merged = lm.merge_and_unload()  # in place, on the device
    reference = cpu_view(merged).eval()
    with torch.no_grad():
        merge_error = max_relative_error(
            reference(prompt_ids[None]).logits.numpy(), adapted(input_ids=prompt_ids[None]).logits.numpy()
        )

    start = time.perf_counter()
    edge = export_generative(merged, prefill_len=16, cache_len=context, progress=False)
    export_s = time.perf_counter() - start
    litert_ids, litert_rows = generate(edge, prompt_ids, new_tokens, return_logits=True)
    torch_ids, torch_rows = reference_generate(reference, prompt_ids, new_tokens, return_logits=True)
    return {
        "model": model,
        "steps": steps,
        "trainable_parameters": trainable,
        "parameters": total,
        "loss_start_end": mean_loss(losses),
        "merge_max_relative_error": merge_error,
        "export_s": export_s,
        "bytes": len(edge.model_content()),
        "prompt": prompt,
        "litert_text": tokenizer.decode(litert_ids),
        "pytorch_text": tokenizer.decode(torch_ids),
        "tokens_equal": int(np.sum(np.array(litert_ids) == np.array(torch_ids))),
        "new_tokens": new_tokens,
        "max_logit_error": max(max_relative_error(a, b) for a, b in zip(litert_rows, torch_rows)),
    }


def report(results: dict) -> None:
    start, end = results["loss_start_end"]
    console.print(
        f"[bold]{results['model']}[/] + LoRA trained on tpu: {results['trainable_parameters']:,} of "
        f"{results['parameters']:,} parameters, {results['steps']} steps, loss {start:.2f} -> {end:.2f}; "
        f"merged (logits within {results['merge_max_relative_error']:.1e} of the adapted model), "
        f"exported in {results['export_s']:.1f} s ({results['bytes']:,} B, prefill + decode)"
    )
    rows = [
        ["PyTorch (merged, CPU)", repr(results["prompt"] + results["pytorch_text"]), "reference", "-"],
        [
            "LiteRT (prefill + decode)",
            repr(results["prompt"] + results["litert_text"]),
            f"{results['tokens_equal']}/{results['new_tokens']}",
            f"{results['max_logit_error']:.1e}",
        ],
    ]
    console.print(results_table("Greedy generation", ["runtime", "text", "tokens equal", "max logit err"], rows))


def main(argv=None) -> dict:
    return cli(
        __doc__,
        run,
        report,
        argv,
        choices={"model": MODELS},
        model="llama",
        steps=200,
        hidden_size=64,
        layers=2,
        heads=4,
        rank=8,
        alpha=16,
        dropout=0.05,
        batch_size=16,
        lr=3e-3,
        new_tokens=24,
    )


if __name__ == "__main__":
    main()
