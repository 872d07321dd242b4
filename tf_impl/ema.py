"""The exponential moving average of the weights (``ema_decay``): the counterpart of :mod:`jax_impl.ema`.

With decay d the average after optimizer step t (1-based) is a_1 = p_1 and a_t = d a_{t-1} + (1 - d) p_t,
the rule of Keras' ``use_ema`` (``ema_momentum`` = d; ``BaseOptimizer._update_model_variables_moving_average``).
The average, not the trained weights, is what the run evaluates (validation loss, time to quality) and
saves with ``--save_weights``: inside :func:`averaged` the trainer reads it.

TensorFlow: Keras' optimizer keeps the average in its own variables (so checkpoints hold it) and updates
it after each step (:func:`optimizer_options`); :func:`averaged` swaps it into the model and the trained
weights back afterwards, through variables made once (:func:`initial`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keras
import tensorflow as tf


def optimizer_options(decay: float) -> dict:
    """How the average follows the optimizer's steps.

    TensorFlow: the Keras optimizer arguments that keep the average of ``decay`` (none when 0: off)."""
    return dict(use_ema=True, ema_momentum=decay) if decay else {}


def initial(model: keras.Model, optimizer, strategy: tf.distribute.Strategy) -> list | None:
    """What the weight average needs at the run's start, kept in the train state (None: off).

    TensorFlow: variables (``ema_backup``) that hold the trained weights while :func:`averaged` shows
    the average, made under ``strategy``'s scope (placed as the model's are), when ``optimizer`` keeps
    an average."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's Adam
    if not getattr(inner, "use_ema", False):
        return None
    with strategy.scope():
        return [tf.Variable(v, trainable=False) for v in model.trainable_variables]


@contextlib.contextmanager
def averaged(state) -> Iterator[keras.Model]:
    """``with averaged(state) as weights``: the weights a run evaluates and saves, the average with
    ``ema_decay``, else the trained ones.

    TensorFlow: the model, the average swapped into its variables, the trained ones back after."""
    model, backup = state.model, state.ema_backup
    if backup is None:
        yield model
        return
    variables = model.trainable_variables
    for saved, v in zip(backup, variables):
        saved.assign(v)
    getattr(state.optimizer, "inner_optimizer", state.optimizer).finalize_variable_values(variables)  # := averages
    try:
        yield model
    finally:
        for saved, v in zip(backup, variables):
            v.assign(saved)
