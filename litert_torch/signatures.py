"""`litert_torch.signature(...)`: one model with several entry points (SignatureDefs).

    edge = (litert_torch.signature("encode", encoder, (x,))
            .signature("decode", decoder, (z,))
            .convert())
    edge(x, signature_name="encode")

Each signature is exported and lowered on its own into a subgraph of one model; the
writer stores constants with equal bytes once, so signatures over the same weights
(the same module with other input shapes, or modules sharing parameters) cost one copy
of those weights.
"""

from __future__ import annotations

import torch

from litert_torch.api import SignatureSpec, _sample_args, convert_signatures
from litert_torch.edge_model import EdgeModel


class SignatureBuilder:
    """An ordered set of named signatures; `.signature(...)` adds one (chainable),
    `.convert(**options)` converts them all into one EdgeModel."""

    def __init__(self):
        self.specs: list[SignatureSpec] = []

    def signature(
        self,
        name: str,
        module: torch.nn.Module,
        sample_args,
        sample_kwargs: dict | None = None,
        dynamic_shapes=None,
        output_names: list[str] | None = None,
    ) -> "SignatureBuilder":
        """Add a signature; `output_names` names forward()'s flattened outputs
        (default: output_0, output_1, ...)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a signature name must be a non-empty string, got {name!r}")
        if any(s.name == name for s in self.specs):
            raise ValueError(
                f"signature {name!r} is already defined; names must be unique (defined: {[s.name for s in self.specs]})"
            )
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"signature {name!r}: expected a torch.nn.Module, got {type(module).__name__}")
        if output_names is not None and (
            isinstance(output_names, str) or not all(isinstance(n, str) and n for n in output_names)
        ):
            raise TypeError(
                f"signature {name!r}: output_names must be a list of non-empty strings, got {output_names!r}"
            )
        self.specs.append(
            SignatureSpec(
                name,
                module,
                _sample_args(sample_args),
                sample_kwargs,
                dynamic_shapes,
                None if output_names is None else list(output_names),
            )
        )
        return self

    def convert(self, *, signature_name: str | None = None, **options) -> EdgeModel:
        """Convert every signature into one model. `options` are those of
        `litert_torch.convert` (strict_export, eval_mode, quant_config, calibration_data,
        target, target_check, progress...); `signature_name` picks the signature that
        calls without `signature_name=` run."""
        if signature_name is not None and signature_name not in self.names:
            raise KeyError(f"no signature named {signature_name!r}; defined: {self.names}")
        edge = convert_signatures(self.specs, **options)
        edge.signature_name = signature_name
        return edge

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def __repr__(self) -> str:
        return f"SignatureBuilder({', '.join(self.names)})"


def signature(
    name: str,
    module: torch.nn.Module,
    sample_args,
    sample_kwargs: dict | None = None,
    dynamic_shapes=None,
    output_names: list[str] | None = None,
) -> SignatureBuilder:
    """Start a multi-signature model with its first signature; chain `.signature(...)`
    for more and finish with `.convert(...)`."""
    return SignatureBuilder().signature(name, module, sample_args, sample_kwargs, dynamic_shapes, output_names)
