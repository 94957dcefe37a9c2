"""Measured comparisons, and the model cases they run.

Every benchmark runs from the repository root as `python -m benchmarks.<group>.<script>`,
grouped by what it measures: `converter`, `device`, `kernels`, `generative`, `anchors`
(benchmarks/README.md: which script answers which question). They time and report with one
harness, `benchmarks.harness`. Shared with the tests, which import them from here:

- `benchmarks.models`: the device's training cases (MLP, small CNN, minGPT-style
  transformer, the Llamas) with their batches, losses and step functions;
- `benchmarks.zoo`: the converter's model zoo (CNNs, transformers from configs, timm);
- `benchmarks.families`: tiny transformers models per generative family (encoder-decoders,
  image-to-text, embedders, vision-language models).
"""
