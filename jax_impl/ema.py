"""The exponential moving average of the weights (``ema_decay``): the counterpart of :mod:`tf_impl.ema`.

With decay d the average after optimizer step t (1-based) is a_1 = p_1 and a_t = d a_{t-1} + (1 - d) p_t,
the rule of Keras' ``use_ema`` (``ema_momentum`` = d; ``BaseOptimizer._update_model_variables_moving_average``).
The average, not the trained weights, is what the run evaluates (validation loss, time to quality) and
saves with ``--save_weights``: inside :func:`averaged` the trainer reads it.

JAX: the average is a second parameter tree in the train state (``ema_params``), updated inside the
jitted step by :func:`update` (:func:`optax.incremental_update`), from :func:`initial`; reading it changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax


def update(average: Any, params: Any, step: jax.Array, decay: float) -> Any:
    """How the average follows the optimizer's steps.

    JAX: the average after the step that turned the parameters into ``params``; ``step`` is the count
    of steps before it (0 for the first, which sets the average to ``params``)."""
    step_size = jnp.where(step == 0, 1.0, 1.0 - decay).astype(jnp.float32)
    return optax.incremental_update(params, average, step_size)


def initial(params: Any, decay: float) -> Any:
    """What the weight average needs at the run's start, kept in the train state (None: off).

    JAX: the average itself (``ema_params``), a copy of ``params``, when ``decay`` is above 0."""
    return jax.tree.map(jnp.copy, params) if decay else None


@contextlib.contextmanager
def averaged(state) -> Iterator[Any]:
    """``with averaged(state) as weights``: the weights a run evaluates and saves, the average with
    ``ema_decay``, else the trained ones.

    JAX: a parameter tree of the state; nothing is swapped."""
    yield state.params if state.ema_params is None else state.ema_params
