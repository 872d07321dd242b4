"""TensorFlow (Keras 3) implementation: model, data, train, distribute. Imports no JAX.

Importing it sets the kit's default XLA flags (:mod:`shared_data.runtime.xla_flags`) before TF starts XLA,
and imports TensorFlow with ``TF_CPP_MIN_LOG_LEVEL`` (default 2: warnings and info off) applied to the
C++ lines TensorFlow prints while it loads (:func:`shared_data.runtime.logs.quiet_import`)."""

import os

from shared_data.core.commands import answer_before_import, command_module
from shared_data.core.errors import import_framework, require_package
from shared_data.runtime.launch import joins_workers
from shared_data.runtime.logs import quiet_import
from shared_data.runtime.signals import guard_command, hold_sigterm
from shared_data.runtime.xla_flags import apply_default_xla_flags

if command_module() == f"{__name__}.train":  # SIGTERM and Ctrl-C while the framework imports: one sentence
    guard_command()
    if joins_workers():  # SIGTERM held for the start's watchdog until the worker has joined
        hold_sigterm()
apply_default_xla_flags(framework="tf")
answer_before_import(__name__)  # --help and bad input answered before the framework loads
require_package("tensorflow", "tf", "tf_impl")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import_framework("tensorflow", quiet_import)  # a framework that cannot load (ulimit -v) is one line
