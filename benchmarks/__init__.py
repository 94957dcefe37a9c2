"""Measured comparisons, and the model cases they run.

The scripts here run from the repository root (`python benchmarks/backend_bench.py ...`).
Two modules are shared with the tests, which import them from here:

- `benchmarks.models`: the device's training cases (MLP, small CNN, minGPT-style
  transformer, the Llamas) with their batches, losses and step functions;
- `benchmarks.zoo`: the converter's model zoo (CNNs, transformers from configs, timm).
"""
