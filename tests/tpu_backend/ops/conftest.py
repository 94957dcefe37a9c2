"""Shared setup for the lowering-table tests: 64-bit JAX (the device enables it too)."""

import jax

jax.config.update("jax_enable_x64", True)
