"""Input pipelines for TensorFlow: ``tf.data`` over the shared NumPy crop reader, and DALI.

``make_input(cfg, split, strategy)`` returns an :class:`Input` whose ``epoch(e)`` iterates that
epoch's batches, distributed over the strategy's replicas. The crop and symmetry logic is the
shared one (:func:`shared_data.loader.NumpyLoader.load`), run in parallel by ``tf.data``'s map.
"""
from __future__ import annotations

from typing import Iterator

import tensorflow as tf

from shared_data import loader, readers
from shared_data.config import Config, batch_sizes
from shared_data.sampler import TRAIN, VAL
from tf_impl import distribute

SPLITS = {"train": TRAIN, "val": VAL}


class Input:
    """Batches of one split for this process: ``steps`` per epoch, ``epoch(e)`` an iterator."""

    def __init__(self, cfg: Config, split: str, strategy: tf.distribute.Strategy):
        self.cfg, self.split, self.strategy = cfg, SPLITS[split], strategy
        self.reader = readers.make_reader(cfg, split)
        self.shards = distribute.local_shards(strategy)
        self.replicas = distribute.num_replicas(strategy)
        self.steps = len(self.plan(0))

    def plan(self, epoch: int, shards: list[int] | None = None) -> loader.EpochPlan:
        return loader.make_plan(self.cfg, self.split, epoch, shards or self.shards, self.replicas, self.reader.size)

    def dataset(self, epoch: int, shard: int) -> tf.data.Dataset:
        """One replica's batches of ``epoch``: (B_local, s, s, s, C) dicts, read in parallel, prefetched."""
        source = loader.NumpyLoader(self.reader, self.plan(epoch, [shard]), self.cfg)
        cfg, s = self.cfg, self.cfg.crop_size

        def load(step):
            b = source.load(int(step))
            return b["inputs"], b["targets"], b["mask"]

        def to_dict(x, y, m):
            return {"inputs": tf.ensure_shape(x, (None, s, s, s, cfg.N_in_channels)),
                    "targets": tf.ensure_shape(y, (None, s, s, s, cfg.N_out_channels)),
                    "mask": tf.ensure_shape(m, (None,))}

        ds = tf.data.Dataset.range(len(source))
        ds = ds.map(lambda i: tf.numpy_function(load, [i], (tf.float32, tf.float32, tf.float32), stateful=False),
                    num_parallel_calls=cfg.num_data_workers, deterministic=True)
        return ds.map(to_dict).prefetch(tf.data.AUTOTUNE)

    @staticmethod
    def element(item) -> dict:
        """A dataset element as the steps' batch dict."""
        return item

    def epoch(self, epoch: int) -> Iterator:
        """Batches of ``epoch``: plain dicts with one replica, per-replica values with several
        (replica ``r`` gets shard ``r``'s batch, as in JAX)."""
        if len(self.shards) == 1 and self.replicas == 1:
            for item in self.dataset(epoch, self.shards[0]):
                yield self.element(item)
            return
        iters = [iter(self.dataset(epoch, r)) for r in self.shards]
        first = self.shards[0]
        for _ in range(self.steps):
            parts = [self.element(next(it)) for it in iters]
            yield self.strategy.experimental_distribute_values_from_function(
                lambda ctx: parts[ctx.replica_id_in_sync_group - first])


def make_input(cfg: Config, split: str, strategy: tf.distribute.Strategy, first_epoch: int = 0):
    """The input pipeline of ``cfg.data_loader_config`` for ``split`` (``"train"`` / ``"val"``);
    ``first_epoch`` is accepted for symmetry with JAX (TF datasets are built per epoch)."""
    del first_epoch
    if cfg.data_loader_config.startswith("dali"):
        from tf_impl.dali import DaliInput
        return DaliInput(cfg, split, strategy)
    return Input(cfg, split, strategy)


def batch_spec(cfg: Config, strategy: tf.distribute.Strategy):
    """A batch of zeros of the right shapes (per replica), on which the steps are compiled."""
    _, local_bs = batch_sizes(cfg, distribute.num_replicas(strategy))
    s = cfg.crop_size

    def make(_ctx=None):
        return {"inputs": tf.zeros((local_bs, s, s, s, cfg.N_in_channels)),
                "targets": tf.zeros((local_bs, s, s, s, cfg.N_out_channels)), "mask": tf.ones((local_bs,))}
    if distribute.num_replicas(strategy) == 1:
        return make()
    return strategy.experimental_distribute_values_from_function(make)
