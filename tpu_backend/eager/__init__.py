"""Eager execution of ATen ops on the tpu device, one module per concern.

- `modes`: the eager mode (strict / debug / fused) and the CPU-fallback switch;
- `errors`: the user's frame in messages, the device's error types;
- `arguments`: torch arguments -> (dynamic JAX values, hashable static template) and back;
- `runner`: `OpRunner` (one per op: jit cache, static-float retry, fused recording) and
  `execute`, the seam every mode shares;
- `debug`: debug mode's checks (meta shapes, NaN/Inf);
- `variants`: matching in-place / out / functional overloads of an op;
- `registration`: the PrivateUse1 kernels built from the lowering table;
- `fallback`: what runs an op without a kernel (functional form, decomposition, CPU).

`tpu_backend.dispatch` re-exports the public names.
"""
