"""Quickstart: train a small CNN on "tpu" for a few seconds, ship it to LiteRT, compare.

    .venv/bin/python examples/quickstart.py

The short form of the flow this project exists for (the full form, with flags, is
`examples/digits_cnn.py`):

1. train a ResNet-style CNN on scikit-learn's handwritten digits on the "tpu" device
   (JAX/XLA underneath: a TPU where one exists, the CPU here);
2. `litert_torch.convert(model, sample)` straight from the device, float32 and full int8;
3. run both .tflite files in the LiteRT interpreter on the 360 held-out images and print
   accuracy, agreement with PyTorch, latency and size side by side with PyTorch.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_cnn import report, run  # noqa: E402

if __name__ == "__main__":
    report(run(epochs=2))
