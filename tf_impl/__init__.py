"""TensorFlow (Keras 3) implementation: model, data, train, distribute. Imports no JAX.

Importing it sets the kit's default XLA flags (:mod:`shared_data.runtime.xla_flags`) before TF starts XLA."""

from shared_data.core.errors import require_package
from shared_data.runtime.xla_flags import apply_default_xla_flags

apply_default_xla_flags()
require_package("tensorflow", "tf", "tf_impl")
