"""The exponential moving average of the weights (``ema_decay``): the counterpart of :mod:`jax_impl.ema`.

Keras' optimizer keeps it (``use_ema=True, ema_momentum=d``): after optimizer step t (1-based) the
average is a_1 = p_1 and a_t = d a_{t-1} + (1 - d) p_t, held in optimizer variables (so checkpoints
hold it). The average, not the trained weights, is what the run evaluates (validation loss, time to
quality) and saves with ``--save_weights``: :class:`AveragedWeights` swaps it into the model for that
and the trained weights back afterwards.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf


def uses_ema(optimizer) -> bool:
    """Whether ``optimizer`` (or the one a ``LossScaleOptimizer`` wraps) keeps a weight average."""
    return bool(getattr(getattr(optimizer, "inner_optimizer", optimizer), "use_ema", False))


class AveragedWeights:
    """``with averaged():`` the model holds the optimizer's weight average, and its trained weights again
    after the block; a no-op without ``use_ema``. ``averaged.read(fn)`` is ``fn(model)`` inside it.
    The trained weights wait in variables created once (under ``strategy``'s scope, so they are
    placed as the model's are)."""

    def __init__(self, model: keras.Model, optimizer, strategy: tf.distribute.Strategy):
        self.model, self.optimizer = model, getattr(optimizer, "inner_optimizer", optimizer)
        self.backup = None
        if uses_ema(optimizer):
            with strategy.scope():
                self.backup = [tf.Variable(v, trainable=False) for v in model.trainable_variables]

    @contextlib.contextmanager
    def __call__(self):
        if self.backup is None:
            yield
            return
        variables = self.model.trainable_variables
        for saved, v in zip(self.backup, variables):
            saved.assign(v)
        self.optimizer.finalize_variable_values(variables)  # Keras: the model's variables := their averages
        try:
            yield
        finally:
            for saved, v in zip(self.backup, variables):
                v.assign(saved)

    def read(self, fn):
        """``fn(model)`` computed while the model holds the weight average (the trained weights without EMA)."""
        with self():
            return fn(self.model)
