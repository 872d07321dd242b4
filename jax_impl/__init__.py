"""JAX (Flax, Optax) implementation: model, data, train, distribute. Imports no TensorFlow.

Importing it sets the kit's default XLA flags (:mod:`shared_data.runtime.xla_flags`) before JAX starts a backend."""

from shared_data.core.errors import require_package
from shared_data.runtime.xla_flags import apply_default_xla_flags

apply_default_xla_flags()
require_package("jax", "jax", "jax_impl")
