"""TensorFlow side of the benchmark modes (the tutorial's "benchy"), driven by :mod:`dlas_compare.benchmark`.

IO: the input pipeline alone, each batch ready on the devices. SYNTHETIC: train steps on one cached
device batch. FULL: train steps on the real input pipeline.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from shared_data.core.config import Config, batch_sizes
from shared_data.data import host_batches
from shared_data.model import schedule, unet_spec

from tf_impl import cluster, distribute
from tf_impl import data as data_mod
from tf_impl import model as model_mod
from tf_impl import step as step_mod


class Bench:
    """``step()`` dispatches one unit of work, ``sync()`` waits for it; ``global_batch`` samples per step.

    ``step_from``: a Bench whose compiled train step, model and optimizer this one takes over instead
    of building its own (the step is compiled again for a device loader's batch of volume and crop
    draws); ``input_from``: one whose input pipeline it takes over. Either gives its distribution
    strategy too. ``compiled_step`` says whether this Bench compiled a train step, ``compile_sec``
    how long it took.
    """

    framework = "tf"

    def __init__(self, cfg: Config, mode: str, num_devices: int | None = None, step_from=None, input_from=None):
        distribute.configure_xla(cfg)
        self.cfg, self.mode = cfg, mode
        shared = step_from or input_from  # one strategy for the step and the input it is fed
        if not shared and (num_devices or 1) > 1 and not tf.config.list_physical_devices("GPU"):
            cluster.split_cpu_once(num_devices)  # data parallel over CPU devices, as JAX's XLA_FLAGS give
        self.strategy = shared.strategy if shared else distribute.make_strategy(num_devices)
        self.replicas = distribute.num_replicas(self.strategy)
        self.global_batch, local_batch = batch_sizes(cfg, self.replicas)
        self.compile_sec, self.compiled_step = 0.0, False
        self._out = None
        if mode in ("io", "full"):
            self.input = input_from.input if input_from else data_mod.make_input(cfg, "train", self.strategy)
            self.batches = input_from.batches if input_from else host_batches.forever(self.input)
            if mode == "io":  # a device loader's crop plans, cut as its step cuts them
                crop = tf.function(lambda b: data_mod.crops(b, cfg), jit_compile=cfg.enable_jit)
                self.crops = tf.function(lambda b: self.strategy.run(crop, args=(b,)))
        if mode in ("synthetic", "full"):
            spec = (
                data_mod.input_spec(self.input, cfg, self.strategy)
                if mode == "full"
                else data_mod.batch_spec(cfg, self.strategy)
            )
            if step_from is not None:
                self.train_fn, self.model, self.optimizer = step_from.train_fn, step_from.model, step_from.optimizer
            else:
                with self.strategy.scope():
                    self.model = model_mod.build_model(cfg)
                    self.optimizer = step_mod.make_optimizer(cfg, schedule.lr_table(cfg, self.global_batch, 10**6))
                    model_mod.params_from_canonical(self.model, unet_spec.init_weights(cfg, cfg.seed))
                    self.optimizer.build(self.model.trainable_variables)
            # a step of its own, or the same step on a device loader's crop plans: compiled for that batch
            if step_from is None or "draws" in spec:
                self.train_fn, _, self.compile_sec = step_mod.compile_steps(
                    cfg, self.strategy, step_mod.TrainState(self.model, self.optimizer), spec
                )
                self.compiled_step = True
        if mode == "synthetic":
            host = host_batches.synthetic_batch(cfg, local_batch)
            self.batch = distribute.per_replica(self.strategy, lambda: {k: tf.constant(v) for k, v in host.items()})

    def step(self) -> None:
        if self.mode == "io":
            batch = next(self.batches)
            self._out = self.crops(batch) if "draws" in batch else batch
            return
        batch = self.batch if self.mode == "synthetic" else next(self.batches)
        self._out = self.train_fn(batch)

    def sync(self) -> None:
        """Wait for the last step: read one element of each output, which the device computes after
        the step (a whole IO batch copied to the host would be timed as part of the pipeline)."""
        for t in tf.nest.flatten(self._out):
            if t is None:  # a metric the step does not have (loss_scale without fp16)
                continue
            for part in getattr(t, "values", [t]):
                np.asarray(tf.reshape(part, [-1])[:1])

    def loss(self) -> float:
        """The last train step's loss (the global batch's mean), waiting for it."""
        return float(self._out["loss"])

    def peak_memory_bytes(self) -> int | None:
        return distribute.peak_memory_bytes()

    def versions(self) -> dict:
        return distribute.versions()

    def device_name(self) -> str:
        return f"{self.replicas} x {distribute.device_kind()}"
