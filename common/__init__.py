"""Leaf package shared by both halves of the project: it imports no package of this
project, so any layer may import it (`converter`, `runtimes`, `litert_torch`,
`tpu_backend`).

- `common.tflite_schema`: LiteRT builtin op names, TensorType names and named op groups.
- `common.package_names`: the clash check of this project's generic top-level names.
- `common.timm_compat`: `import timm` without a loadable torchvision.
- `common.resampling`: the sampling arithmetic PyTorch's pooling and interpolation kernels
  use (adaptive windows, linear weights, nearest indices), as numpy arrays both the
  converter and the tpu device build their ops from.
- `common.files`: `write_atomic`, the one atomic file write (the file's mode follows the umask).
- `common.messages`: wording shared by error messages (`a_type`: "an int", "None").
"""
