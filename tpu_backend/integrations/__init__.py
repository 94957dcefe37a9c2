"""Integrations with libraries that need to know about the "tpu" device.

Each integration is installed when `tpu_backend` is imported and applies itself when
the library is imported (before or after us), so users change nothing in their code.
"""

from __future__ import annotations

from tpu_backend.integrations.post_import import when_imported  # noqa: F401  (public here too)


def install() -> None:
    from tpu_backend.integrations import accelerate as _accelerate
    from tpu_backend.integrations import dynamo as _dynamo
    from tpu_backend.integrations import trainer as _trainer
    from tpu_backend.integrations import transformers as _transformers

    _dynamo.install()
    _transformers.install()
    _trainer.install()  # Trainer's loss bookkeeping without a host read per step
    _accelerate.install()  # Accelerator() and Trainer pick the "tpu" device
