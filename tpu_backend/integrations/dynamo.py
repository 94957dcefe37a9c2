"""`torch.compile(backend="tpu")` without the package installed (the checkout on PYTHONPATH).

Dynamo finds backends it does not ship in its registry or through the
`torch_dynamo_backends` entry point of an installed distribution (pyproject.toml). A
checkout on PYTHONPATH has no distribution metadata, so the name must be registered at
import. Registering `tpu_backend.compile.backend.tpu` itself would import the compile
package (seconds) with every `import tpu_backend`; a forwarder is registered instead and
replaced by the real backend when the compile package is imported (by it, or by the first
compile through the forwarder).
"""

from __future__ import annotations

BACKEND_NAME = "tpu"


def tpu(gm, example_inputs, **kwargs):
    """The "tpu" Dynamo backend: imports `tpu_backend.compile` and hands the graph to it."""
    from tpu_backend.compile.backend import tpu as compile_for_tpu

    return compile_for_tpu(gm, example_inputs, **kwargs)


tpu.forwards_to_compile_backend = True  # compile/backend.py replaces a registered forwarder


def _register(registry) -> None:
    if BACKEND_NAME not in registry._COMPILER_FNS:
        registry.register_backend(tpu, name=BACKEND_NAME)


def install() -> None:
    from tpu_backend.integrations.post_import import when_imported

    when_imported("torch._dynamo.backends.registry", _register)
