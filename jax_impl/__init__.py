"""JAX (Flax, Optax) implementation: model, data, train, distribute. Imports no TensorFlow.

Importing it sets the kit's default XLA flags (:mod:`shared_data.runtime.xla_flags`) before JAX starts a backend."""

from shared_data.core.commands import answer_before_import, command_module
from shared_data.core.errors import import_framework, require_package
from shared_data.runtime.signals import guard_command
from shared_data.runtime.xla_flags import apply_default_xla_flags

if command_module() == f"{__name__}.train":  # SIGTERM and Ctrl-C while the framework imports: one sentence
    guard_command()
apply_default_xla_flags()
answer_before_import(__name__)  # --help and bad input answered before the framework loads
require_package("jax", "jax", "jax_impl")
import_framework("jax")  # a framework that cannot load (ulimit -v) is one line
