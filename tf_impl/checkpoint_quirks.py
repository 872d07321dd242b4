"""What Keras and TensorFlow need around a save that their APIs do not give: Keras 3 variables that an
asynchronous ``tf.train.CheckpointManager`` save can copy to the host more than once.
:class:`tf_impl.checkpoints.Checkpoints` uses it; the counterpart of :mod:`jax_impl.checkpoint_quirks`.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf


@contextlib.contextmanager
def keras_variables_copied_in_place():
    """Around an asynchronous ``tf.train.CheckpointManager.save`` of Keras 3 variables: each Keras
    variable's host copy is assigned in place after the first save. Keras' own
    ``Variable._copy_trackable_to_cpu`` creates a new ``tf.Variable`` at every save, inside the
    ``tf.function`` TensorFlow's asynchronous writer traces once, so a second save fails with
    "tf.function only supports singleton tf.Variables created on the first call"."""
    from keras.src.backend.tensorflow.core import Variable

    keras_copy = Variable._copy_trackable_to_cpu

    def copy_in_place(self, object_map):
        self.value._copy_trackable_to_cpu(object_map)  # the tf.Variable's own host copy
        if self in object_map:
            object_map[self].assign(object_map[self.value])
        else:
            object_map[self] = tf.Variable(object_map[self.value])

    Variable._copy_trackable_to_cpu = copy_in_place
    try:
        yield
    finally:
        Variable._copy_trackable_to_cpu = keras_copy
