"""Data parallelism on CPU: 2 JAX devices == 1 device, TF MirroredStrategy over 2 logical CPUs ==
one device, and two JAX processes on localhost == one process with 2 devices (same global batches)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import jax
import numpy as np

from jax_impl import distribute as jd
from jax_impl import model as JM
from jax_impl import train as JT
from shared_data import loader, readers
from shared_data.config import REPO_ROOT
from shared_data.sampler import TRAIN

RTOL, ATOL = 1e-4, 1e-6  # fp32, different reduction orders; updates are ~lr = 1e-3


def _global_batches(cfg, steps=3):
    r = readers.make_reader(cfg)
    plan = loader.make_plan(cfg, TRAIN, 0, [0, 1], 2, r.size)
    src = loader.NumpyLoader(r, plan, cfg)
    return [src.load(i) for i in range(steps)]


def test_jax_two_devices_match_one(tiny_cfg):
    assert jax.device_count() >= 2  # conftest: --xla_force_host_platform_device_count=2
    batches = _global_batches(tiny_cfg)
    tx = JT.make_optimizer(np.full(8, 1e-3, np.float32))
    model = JM.build_model(tiny_cfg)
    result = {}
    for n in (1, 2):
        mesh = jd.make_mesh(n)
        state = jax.device_put(JT.create_train_state(tiny_cfg, JM.init_params(tiny_cfg, 0), tx), jd.replicated(mesh))
        step = jax.jit(lambda s, b: JT.train_step(s, b, model=model, tx=tx, cfg=tiny_cfg))
        for b in batches:
            state, _ = step(state, jd.put_batch(b, mesh))
        assert len(state.params["down1"]["kernel"].sharding.device_set) == n
        result[n] = JM.params_to_canonical(jax.device_get(state.params))
    for k in result[1]:
        np.testing.assert_allclose(result[2][k], result[1][k], rtol=RTOL, atol=ATOL, err_msg=k)


TF_SCRIPT = r"""
import sys
from tf_impl import distribute
distribute.split_cpu(2)
import numpy as np, tensorflow as tf
from shared_data import config as C, loader, readers
from tf_impl import data as D, model as M, train as T
cfg = C.load_config("cpu_tiny", overrides=dict(train_path=sys.argv[1], val_path=sys.argv[2]))
r = readers.make_reader(cfg)
plan = loader.make_plan(cfg, 0, 0, [0, 1], 2, r.size)
batches = [loader.NumpyLoader(r, plan, cfg).load(i) for i in range(3)]
def run(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        model, opt = M.build_model(cfg), T.make_optimizer(cfg, np.full(8, 1e-3, np.float32))
        M.set_canonical(model, __import__("shared_data.unet_spec", fromlist=["x"]).init_weights(cfg, 0))
    train_fn, _, _ = T.compile_steps(cfg, strategy, model, opt, D.batch_spec(cfg, strategy))
    for b in batches:
        if n == 1:
            batch = {k: tf.constant(v) for k, v in b.items()}
        else:
            per = len(b["mask"]) // n
            batch = strategy.experimental_distribute_values_from_function(
                lambda ctx: {k: tf.constant(v[ctx.replica_id_in_sync_group * per:(ctx.replica_id_in_sync_group + 1) * per]) for k, v in b.items()})
        train_fn(batch)
    return M.get_canonical(model)
one = run(tf.distribute.get_strategy())
two = run(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
for k in one:
    np.testing.assert_allclose(two[k], one[k], rtol=%g, atol=%g, err_msg=k)
print("MirroredStrategy over 2 CPUs == 1 device")
""" % (RTOL, ATOL)


def test_tf_mirrored_strategy_matches_one_device(tiny_cfg):
    res = subprocess.run([sys.executable, "-c", TF_SCRIPT, tiny_cfg.train_path, tiny_cfg.val_path], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_jax_processes_match_one_process(tiny_cfg, tmp_path):
    common = ["-m", "jax_impl.train", "--config", "cpu_tiny", "--set", f"train_path={tiny_cfg.train_path}",
              "--set", f"val_path={tiny_cfg.val_path}", "--set", f"xla_cache_dir={tmp_path / 'cache'}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    single = subprocess.run([sys.executable, *common, "--workdir", str(tmp_path / "single"), "--save_weights", str(tmp_path / "single.npz")],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                            env={**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert single.returncode == 0, single.stderr[-3000:]
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, *common, "--workdir", str(tmp_path / "multi"), "--save_weights", str(tmp_path / "multi.npz")],
                              cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
                                   "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)})
             for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    assert "data parallel: 2 replicas, global batch 4, local batch 2" in outs[0]
    a, b = np.load(tmp_path / "single.npz"), np.load(tmp_path / "multi.npz")
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=ATOL, err_msg=k)
