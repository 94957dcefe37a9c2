"""What `torch.amp.GradScaler` runs: unscale the gradients, note an inf or NaN, update the scale.

`GradScaler.unscale_` calls `_amp_foreach_non_finite_check_and_unscale_` once per gradient
dtype, and `GradScaler.update` calls `_amp_update_scale_`; both mutate their arguments, so
the in-place overloads are `functionalized` records pointing at the functional ones (as the
fused optimizers, `ops/optimizers.py`). The math is that of ATen's CPU kernels
(`aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp`):
- unscale: each gradient times `inv_scale` in its opmath dtype; `found_inf` becomes 1.0 when
  any gradient holds an inf or NaN, and is left as it was otherwise (the caller zeroes it);
- update: `found_inf` set: scale times the backoff factor, tracker 0. Else the tracker counts
  one more good step; at `growth_interval` the scale grows (when the grown scale is finite)
  and the tracker restarts at 0. Products are taken in float64 and rounded to the scale's
  float32, as C++ does for `float *= double`.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from tpu_backend.ops.registry import Functionalized, lowers

aten = torch.ops.aten


def _opmath(dtype):
    return jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else dtype


@lowers(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_foreach_non_finite_check_and_unscale(grads, found_inf, inv_scale):
    """(gradients times `inv_scale`, `found_inf` set to 1.0 if any gradient is not finite)."""
    inv = inv_scale.reshape(-1)[0]
    unscaled, non_finite = [], jnp.zeros((), bool)
    for grad in grads:
        non_finite = non_finite | ~jnp.all(jnp.isfinite(grad))
        ct = _opmath(grad.dtype)
        unscaled.append((grad.astype(ct) * inv.astype(ct)).astype(grad.dtype))
    return unscaled, jnp.where(non_finite, jnp.ones_like(found_inf), found_inf)


@lowers(aten._amp_update_scale.default)
def amp_update_scale(scale, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    """(new scale, new growth tracker) after one step that did or did not find an inf."""
    found = found_inf.reshape(-1)[0] != 0
    wide = scale.astype(jnp.float64)
    backed_off = (wide * jnp.asarray(scale_backoff_factor, jnp.float64)).astype(scale.dtype)
    grown = (wide * jnp.asarray(scale_growth_factor, jnp.float64)).astype(scale.dtype)
    successful = growth_tracker + 1
    grow = successful == growth_interval
    new_scale = jnp.where(found, backed_off, jnp.where(grow & jnp.isfinite(grown), grown, scale))
    new_tracker = jnp.where(found | grow, jnp.zeros_like(growth_tracker), successful)
    return new_scale, new_tracker


# The in-place overloads GradScaler calls: argument k <- output k.
lowers(
    aten._amp_foreach_non_finite_check_and_unscale_.default,
    functionalized=Functionalized(aten._amp_foreach_non_finite_check_and_unscale.default, {0: 0, 1: 1}, 0),
)(amp_foreach_non_finite_check_and_unscale)
lowers(
    aten._amp_update_scale_.default,
    functionalized=Functionalized(aten._amp_update_scale.default, {0: 0, 1: 1}, 1),
)(amp_update_scale)
