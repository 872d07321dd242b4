"""JAX side of the benchmark modes (the tutorial's "benchy"), driven by :mod:`dlas_compare.benchmark`.

IO: the input pipeline alone, each batch ready on the devices. SYNTHETIC: train steps on one cached
device batch. FULL: train steps on the real input pipeline.
"""

from __future__ import annotations

import functools

import jax

from shared_data.core.config import Config, batch_sizes
from shared_data.data import host_batches
from shared_data.model import schedule, unet_spec

from jax_impl import data as data_mod
from jax_impl import distribute
from jax_impl import model as model_mod
from jax_impl import step as step_mod


class Bench:
    """``step()`` dispatches one unit of work, ``sync()`` waits for it; ``global_batch`` samples per step.

    ``step_from``: a Bench whose compiled train step and (latest, since the step donates it) state this
    one takes over instead of compiling its own (the step is compiled again for a device loader's
    batch of volume and crop draws); ``input_from``: one whose input pipeline it takes over.
    ``compiled_step`` says whether this Bench compiled a train step, ``compile_sec`` how long it took.
    """

    framework = "jax"

    def __init__(self, cfg: Config, mode: str, num_devices: int | None = None, step_from=None, input_from=None):
        distribute.configure_xla(cfg)
        self.cfg, self.mode = cfg, mode
        self.mesh = distribute.make_mesh(num_devices)
        self.replicas = distribute.num_replicas(self.mesh)
        self.global_batch, _ = batch_sizes(cfg, self.replicas)
        self.compile_sec, self.compiled_step = 0.0, False
        self._out = None
        if mode in ("io", "full"):
            self.input = input_from.input if input_from else data_mod.make_input(cfg, "train", self.mesh)
            self.batches = input_from.batches if input_from else host_batches.forever(self.input)
            if mode == "io":  # a device loader's crop plans, cut as its step cuts them
                self.crops = jax.jit(functools.partial(data_mod.crops, cfg=cfg))
        spec = (
            data_mod.input_spec(self.input, cfg, self.mesh) if mode == "full" else data_mod.batch_spec(cfg, self.mesh)
        )
        if mode in ("synthetic", "full") and step_from is not None:
            self.train_fn, self.state, self.model, self.tx = (
                step_from.train_fn,
                step_from.state,
                step_from.model,
                step_from.tx,
            )
            if "draws" in spec:  # the same step on a device loader's crop plans: compiled for that batch
                self.train_fn, _, self.compile_sec = step_mod.compile_steps(cfg, self.model, self.tx, self.state, spec)
                self.compiled_step = True
        elif mode in ("synthetic", "full"):
            self.tx = step_mod.make_optimizer(cfg, schedule.lr_table(cfg, self.global_batch, 10**6))
            params = model_mod.params_from_canonical(unet_spec.init_weights(cfg, cfg.seed))
            self.state = jax.device_put(
                step_mod.create_train_state(cfg, params, self.tx), distribute.replicated(self.mesh)
            )
            self.model = model_mod.build_model(cfg)
            self.train_fn, _, self.compile_sec = step_mod.compile_steps(cfg, self.model, self.tx, self.state, spec)
            self.compiled_step = True
        if mode == "synthetic":
            host = host_batches.synthetic_batch(cfg, self.global_batch)
            self.batch = {k: jax.device_put(v, spec[k].sharding) for k, v in host.items()}

    def step(self) -> None:
        if self.mode == "io":
            batch = next(self.batches)
            self._out = self.crops(batch) if "draws" in batch else batch
            return
        batch = self.batch if self.mode == "synthetic" else next(self.batches)
        self.state, self._out = self.train_fn(self.state, batch)

    def sync(self) -> None:
        jax.block_until_ready(self._out)

    def loss(self) -> float:
        """The last train step's loss (the global batch's mean), waiting for it."""
        return float(self._out["loss"])

    def peak_memory_bytes(self) -> int | None:
        return distribute.peak_memory_bytes()

    def versions(self) -> dict:
        return distribute.versions()

    def device_name(self) -> str:
        d = jax.devices()[0]
        return f"{self.replicas} x {getattr(d, 'device_kind', d.platform)}"
