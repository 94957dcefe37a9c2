"""The Pallas kernels against XLA (`kernels_bench`), and the one-command check for a CUDA
GPU machine (`accelerator_check`)."""
