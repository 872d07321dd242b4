"""The SYNTHETIC bench of this study: the kit's train step or a variant of it, built from the public
pieces of :mod:`jax_impl.train` (model, optimizer, state, ``loss_fn``), compiled with optional XLA
compiler options, and timed by :func:`dlas_compare.benchmark_timing.run_bench`.

The variants need what the production step does not offer: the gradients passed through a function
before the update (an explicit ``lax.pmean`` inside ``shard_map``, or an ``optimization_barrier``),
and compiler options such as a PGLE profile (``{"fdo_profile": bytes}``). float32 / bfloat16 only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import optax
from jax.sharding import PartitionSpec as P

from shared_data.core.config import Config, batch_sizes
from shared_data.data import host_batches
from shared_data.model import schedule, unet_spec

from jax_impl import data as data_mod
from jax_impl import distribute
from jax_impl import model as model_mod
from jax_impl import step as step_mod


def step_with(cfg: Config, model, tx, sync: Callable | None):
    """``(state, batch) -> (state, metrics)``: the kit's step with ``sync((loss, grads))`` applied
    before Adam (None: the production step itself)."""
    if sync is None:
        return functools.partial(step_mod.train_step, model=model, tx=tx, cfg=cfg)

    def step(state, batch):
        def compute_loss(params):
            return step_mod.loss_fn(model.apply({"params": params}, batch["inputs"]), batch, cfg)

        loss, grads = sync(jax.value_and_grad(compute_loss)(state.params))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), {"loss": loss}

    return step


class StudyBench:
    """A SYNTHETIC bench of the kit's step (``variant=None``), of it with a barrier (``"barrier"``), or
    of it per device in ``shard_map`` with (``"pmean"``) or without (``"local"``) the all-reduce."""

    framework = "jax"

    def __init__(self, cfg: Config, num_devices: int, variant: str | None = None, compiler_options: dict | None = None):
        distribute.configure_xla(cfg)
        self.cfg, self.mode = cfg, "synthetic"
        self.mesh = distribute.make_mesh(num_devices)
        self.replicas = distribute.num_replicas(self.mesh)
        self.global_batch, _ = batch_sizes(cfg, self.replicas)
        tx = step_mod.make_optimizer(cfg, schedule.lr_table(cfg, self.global_batch, 10**6))
        model = model_mod.build_model(cfg)
        params = model_mod.params_from_canonical(unet_spec.init_weights(cfg, cfg.seed))
        self.state = jax.device_put(step_mod.create_train_state(cfg, params, tx), distribute.replicated(self.mesh))
        spec = data_mod.batch_spec(cfg, self.mesh)
        sync = {
            "pmean": lambda tree: jax.lax.pmean(tree, "data"),
            "local": lambda tree: tree,
            "barrier": jax.lax.optimization_barrier,
        }.get(variant)
        step = step_with(cfg, model, tx, sync)
        if variant in ("pmean", "local"):  # per device; JAX itself would sum replicated grads with check_vma on
            step = jax.shard_map(step, mesh=self.mesh, in_specs=(P(), P("data")), out_specs=(P(), P()), check_vma=False)
        import time

        t0 = time.perf_counter()
        jitted = jax.jit(step, donate_argnums=0)
        self.train_fn = jitted.lower(distribute.abstract(self.state), spec).compile(compiler_options)
        self.compile_sec = time.perf_counter() - t0
        host = host_batches.synthetic_batch(cfg, self.global_batch)
        self.batch = {k: jax.device_put(v, spec[k].sharding) for k, v in host.items()}
        self._out = None

    def step(self) -> None:
        self.state, self._out = self.train_fn(self.state, self.batch)

    def sync(self) -> None:
        jax.block_until_ready(self._out)

    def peak_memory_bytes(self):
        return distribute.peak_memory_bytes()

    def versions(self) -> dict:
        return distribute.versions()

    def device_name(self) -> str:
        d = jax.devices()[0]
        return f"{self.replicas} x {getattr(d, 'device_kind', d.platform)}"
