"""The "tpu" device's benchmarks: training step time per execution mode (against PyTorch
CPU and hand-written JAX), compile and first-step time, distributed scaling, dynamic
shapes, `scan_layers`, Hugging Face `Trainer` / `generate()` / diffusers, ahead-of-time
memory plans, and the chip's arithmetic."""
