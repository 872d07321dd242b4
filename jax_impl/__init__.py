"""JAX (Flax, Optax) implementation: model, data, train, distribute. Imports no TensorFlow.

Importing it sets the kit's default XLA flags (:mod:`shared_data.runtime.xla_flags`) before JAX starts a backend."""

from shared_data.core.commands import answer_before_import
from shared_data.core.errors import require_package
from shared_data.runtime.xla_flags import apply_default_xla_flags

apply_default_xla_flags()
answer_before_import(__name__)  # --help and bad input answered before the framework loads
require_package("jax", "jax", "jax_impl")
