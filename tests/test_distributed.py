"""Data parallelism on CPU: 2 JAX devices == 1 device, TF MirroredStrategy over 2 logical CPUs ==
one device, and two JAX processes on localhost == one process with 2 devices (same global batches);
the trainers on 1 and 2 replicas are the same experiment (the sampler gives every world size the
same global batches), also across a resume on another world size, mid-epoch included."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import run_in_process, train_with_signal_at
from processes import SIGNAL_AT, cpu_xla_flags

from shared_data.core import config as config_mod
from shared_data.core.config import REPO_ROOT
from shared_data.data import crop_readers, host_batches
from shared_data.data.sampler import TRAIN
from shared_data.runtime.records import read_metrics

from jax_impl import distribute as jax_distribute
from jax_impl import model as jax_model
from jax_impl import step as jax_step
from jax_impl import train as jax_train

pytestmark = pytest.mark.slow

RTOL, ATOL = 1e-4, 1e-6  # fp32, different reduction orders; updates are ~lr = 1e-3
# losses of the same global batches on 1 and 2 replicas (float32 sums in another order; on CPU the
# per-epoch losses agree to a few 1e-7 relative)
LOSS_RTOL = 1e-5
# bfloat16 compute, 1 vs 2 devices with the gradients summed in bfloat16: each replica's gradient is
# rounded to bfloat16 before the sum, one device's after it, and Adam turns a changed near-zero
# gradient into a step of up to ~lr. Compared: |update_2 - update_1| / |update_1| over all parameters
# (L2). On CPU with the generated 32^3 volume this is 6e-4 (JAX) and 2e-3 (TF); a replica that missed
# the gradient sum (training on its half batch alone) gives 0.56. The bound sits between the two.
BF16_REL_UPDATE = 0.05


def _losses(workdir):
    return np.array([(h["train_loss"], h["val_loss"]) for h in read_metrics(workdir)])


def test_jax_trainer_on_two_devices_is_one_devices_experiment_across_a_mid_epoch_resume(
    tiny_cfg, tmp_path, monkeypatch
):
    """2 epochs of 3 steps: straight on 1 device; on 2 devices stopped by SIGUSR1 inside epoch 2,
    then resumed on 1 device from the data cursor. Epoch 1 (2 devices) and epoch 2 (both) give the
    1-device losses and weights to float32 reduction order."""
    cfg = config_mod.replace(tiny_cfg, Nsamples=12, num_epochs=2)
    one = jax_train.train_and_evaluate(cfg, tmp_path / "one", num_devices=1)[0]
    stopped = train_with_signal_at(jax_train, monkeypatch, 3, signal.SIGUSR1, cfg, tmp_path / "two", num_devices=2)
    assert "epoch 2, step 2 of 3" in str(stopped)
    resumed = jax_train.train_and_evaluate(cfg, tmp_path / "two", num_devices=1, resume=True)[0]
    got, want = _losses(tmp_path / "two"), _losses(tmp_path / "one")
    print("JAX 2 devices (epoch 1) then 1 device, against 1 device: loss rel. diff", np.abs(got / want - 1).max())
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL)
    a, b = (jax_model.params_to_canonical(jax.device_get(s.params)) for s in (one, resumed))
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=ATOL, err_msg=k)


def _global_batches(cfg, steps=3):
    r = crop_readers.make_reader(cfg)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0, 1], 2, r.size)
    src = host_batches.NumpyLoader(r, plan, cfg)
    return [src.load(i) for i in range(steps)]


@pytest.mark.parametrize("reduce_dtype", ["float32", "bfloat16"])
def test_jax_two_devices_match_one(tiny_cfg, reduce_dtype):
    """2 devices == 1 device with the same global batches: float32 compute; and bfloat16 compute
    with the gradients summed in bfloat16 against one device's bfloat16-compute step."""
    assert jax.device_count() >= 2  # conftest: --xla_force_host_platform_device_count=2
    batches = _global_batches(tiny_cfg)
    tx = jax_step.make_optimizer(tiny_cfg, np.full(8, 1e-3, np.float32))
    result = {}
    amp = reduce_dtype == "bfloat16"
    for n, dtype in ((1, "float32"), (2, reduce_dtype)):
        cfg = config_mod.replace(tiny_cfg, enable_amp=amp, amp_dtype="bfloat16", grad_allreduce_dtype=dtype)
        model = jax_model.build_model(cfg)
        mesh = jax_distribute.make_mesh(n)
        state = jax.device_put(
            jax_step.create_train_state(cfg, jax_model.init_params(cfg, 0), tx), jax_distribute.replicated(mesh)
        )
        step = jax.jit(lambda s, b: jax_step.train_step(s, b, model=model, tx=tx, cfg=cfg))
        for b in batches:
            state, _ = step(state, jax_distribute.put_batch(b, mesh))
        assert len(state.params["down1"]["kernel"].sharding.device_set) == n
        assert all(v.dtype == np.float32 for v in jax.tree.leaves(state.opt_state) if v.ndim)
        result[n] = jax_model.params_to_canonical(jax.device_get(state.params))
    if reduce_dtype == "float32":
        for k in result[1]:
            np.testing.assert_allclose(result[2][k], result[1][k], rtol=RTOL, atol=ATOL, err_msg=k)
    else:
        start = jax_model.params_to_canonical(jax_model.init_params(tiny_cfg, 0))
        diff = np.sqrt(sum(np.sum((result[2][k] - result[1][k]) ** 2) for k in start))
        update = np.sqrt(sum(np.sum((result[1][k] - start[k]) ** 2) for k in start))
        assert update > 0 and diff / update < BF16_REL_UPDATE, diff / update


TF_SCRIPT = r"""
import sys
from tf_impl import cluster, distribute
cluster.split_cpu(2)
import numpy as np, tensorflow as tf
from shared_data.core import config as config_mod
from shared_data.data import host_batches
from shared_data.data import crop_readers
from shared_data.model import unet_spec
from tf_impl import data as data_mod, model as model_mod, step as step_mod
base = config_mod.load_config("cpu_tiny", overrides=dict(train_path=sys.argv[1], val_path=sys.argv[2]))
cfg = base
r = crop_readers.make_reader(cfg)
plan = host_batches.make_plan(cfg, 0, 0, [0, 1], 2, r.size)
batches = [host_batches.NumpyLoader(r, plan, cfg).load(i) for i in range(3)]
def run(strategy, cfg):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        model, opt = model_mod.build_model(cfg), step_mod.make_optimizer(cfg, np.full(8, 1e-3, np.float32))
        model_mod.params_from_canonical(model, unet_spec.init_weights(cfg, 0))
    train_fn, _, _ = step_mod.compile_steps(
        cfg, strategy, step_mod.TrainState(model, opt), data_mod.batch_spec(cfg, strategy)
    )
    for b in batches:
        if n == 1:
            batch = {k: tf.constant(v) for k, v in b.items()}
        else:
            per = len(b["mask"]) // n
            batch = strategy.experimental_distribute_values_from_function(
                lambda ctx: {k: tf.constant(v[ctx.replica_id_in_sync_group * per:][:per]) for k, v in b.items()})
        train_fn(batch)
    return model_mod.params_to_canonical(model)
mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
one = run(tf.distribute.get_strategy(), base)
two = run(mirrored, base)
for k in one:
    np.testing.assert_allclose(two[k], one[k], rtol=%g, atol=%g, err_msg=k)
print("MirroredStrategy over 2 CPUs == 1 device")
# the device loader on 2 replicas: each replica's crop plan (volume, draws, mask) is on its device, and
# the crops its step cuts from it equal the NumPy loader's
dev_cfg = config_mod.replace(base, data_loader_config="device")
dev = data_mod.make_input(dev_cfg, "train", mirrored)
nat = data_mod.make_input(config_mod.replace(base, data_loader_config="lowmem"), "train", mirrored)
cut = tf.function(lambda b: mirrored.run(lambda r: data_mod.crops(r, dev_cfg), args=(b,)))
for plan, w in zip(dev.epoch(0), nat.epoch(0)):
    for k in ("volume", "draws", "mask"):
        parts = mirrored.experimental_local_results(plan[k])
        assert [p.device for p in parts] == list(mirrored.extended.worker_devices), (k, parts)
    g = cut(plan)
    for k in ("inputs", "targets", "mask"):
        for a, b in zip(mirrored.experimental_local_results(g[k]), mirrored.experimental_local_results(w[k])):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
print("device loader on 2 replicas == NumPy loader")
# bfloat16 compute; 2 replicas sum their gradients in bfloat16 (see BF16_REL_UPDATE)
amp = config_mod.replace(base, enable_amp=True, amp_dtype="bfloat16")
one = run(tf.distribute.get_strategy(), amp)
two = run(mirrored, config_mod.replace(amp, grad_allreduce_dtype="bfloat16"))
start = __import__("shared_data.model.unet_spec", fromlist=["x"]).init_weights(base, 0)
diff = np.sqrt(sum(np.sum((two[k] - one[k]) ** 2) for k in start))
update = np.sqrt(sum(np.sum((one[k] - start[k]) ** 2) for k in start))
print("bf16 gradient sum: relative update difference %%.3f" %% (diff / update))
assert update > 0 and diff / update < %g, diff / update
""" % (RTOL, ATOL, BF16_REL_UPDATE)


def test_tf_mirrored_strategy_matches_one_device(tiny_cfg):
    res = subprocess.run(
        [sys.executable, "-c", TF_SCRIPT, tiny_cfg.train_path, tiny_cfg.val_path],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    print(res.stdout[-300:])


TF_TRAIN_SCRIPT = (
    r"""
import sys
import numpy as np
from tf_impl import cluster
cluster.split_cpu(2)
from shared_data.runtime.records import read_metrics
from tf_impl import step as step_mod
from tf_impl import train as train_mod
args = ["--config", "cpu_tiny", "--set", "train_path=" + sys.argv[1], "--set", "val_path=" + sys.argv[2],
        "--num_epochs", "2", "--data_loader_config", "device"]
two = args + ["--workdir", sys.argv[3]]
assert train_mod.main(two + ["--num_devices", "2", "--stop_after_epoch", "1"]) == 0
assert train_mod.main(two + ["--num_devices", "1", "--resume"]) == 0
assert train_mod.main(args + ["--num_devices", "1", "--workdir", sys.argv[3] + "-one"]) == 0
hist, one = read_metrics(sys.argv[3]), read_metrics(sys.argv[3] + "-one")
assert [h["epoch"] for h in hist] == [1, 2] and hist[-1]["step"] == 2 * hist[0]["step"] > 0, hist
got, want = (np.array([(h["train_loss"], h["val_loss"]) for h in x]) for x in (hist, one))
print("TF 2 replicas (epoch 1) then 1 device, against 1 device: loss rel. diff", np.abs(got / want - 1).max())
np.testing.assert_allclose(got, want, rtol=%g)
"""
    % LOSS_RTOL
)


def test_tf_trainer_on_two_replicas_is_one_devices_experiment_across_a_resume(tiny_cfg, tmp_path):
    """The whole TF trainer under MirroredStrategy (2 logical CPUs, the device loader): epoch 1 on 2
    replicas, stop, resume on 1 device for epoch 2; the losses equal a 1-device run's to float32
    reduction order (a separate process: strategies of one process share collective keys)."""
    res = subprocess.run(
        [sys.executable, "-c", TF_TRAIN_SCRIPT, tiny_cfg.train_path, tiny_cfg.val_path, str(tmp_path / "run")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    log = res.stderr + res.stdout
    assert "data parallel: 2 replicas" in log and "input: device loader, 16^3 crops, symmetries cube48" in log
    print(res.stdout[-200:])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jax_processes(argv, port, signal_rank_1_at=None, **env):
    """Two JAX trainer processes on localhost (one CPU device each), started together; with
    ``signal_rank_1_at``, process 1 alone sends itself SIGUSR1 at that training batch (processes.SIGNAL_AT)."""
    commands = [[sys.executable, "-m", "jax_impl.train"]] * 2
    if signal_rank_1_at is not None:
        commands[1] = [*SIGNAL_AT, str(signal_rank_1_at), "SIGUSR1", "-m", "jax_impl.train"]
    return [
        subprocess.Popen(
            [*command, *argv],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": cpu_xla_flags(1),
                "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": str(i),
                **env,
            },
        )
        for i, command in enumerate(commands)
    ]


def test_two_jax_processes_are_one_process_and_stop_together_on_one_ranks_signal_and_resume_exactly(
    tmp_path, tiny_argv
):
    """Two processes on localhost (one CPU device each) train the experiment of one process on 2
    devices. Process 1 alone gets SIGUSR1 (a real signal, sent at its training batch 5: in step 2 of
    epoch 2's 4): both processes stop at the same step boundary (exit 138, step 3 in their last
    line), the checkpoint and data cursor are written, and the requeued job (SLURM_RESTART_COUNT=1,
    no --resume) ends with the losses and weights of an uninterrupted one-process run on 2 devices.
    The log of a batch job has the epoch lines once, from process 0; process 1 prints no INFO line."""
    steps = 4
    argv = [*tiny_argv, "--set", f"xla_cache_dir={tmp_path / 'cache'}", "--set", f"Nsamples={4 * steps}"]
    argv += ["--set", "num_epochs=2"]
    single = run_in_process(
        jax_train.main, [*argv, "--workdir", str(tmp_path / "single"), "--save_weights", str(tmp_path / "single.npz")]
    )
    assert single.returncode == 0, single.stderr[-3000:]
    multi = [*argv, "--workdir", str(tmp_path / "multi"), "--save_weights", str(tmp_path / "multi.npz")]
    procs = _jax_processes(multi, _free_port(), signal_rank_1_at=steps + 1)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [138, 138], outs[0][1][-2000:] + outs[1][1][-2000:]
    cursor = json.loads((tmp_path / "multi" / "mid_epoch" / "cursor.json").read_text())
    assert (cursor["epoch"], cursor["step"]) == (1, 2), cursor
    for _, err in outs:
        assert f"stopped by SIGUSR1 at epoch 2, step 3 of {steps}: saved in" in err.strip().splitlines()[-1], err
    rank_0, rank_1 = (out + err for out, err in outs)
    assert "data parallel: 2 replicas, global batch 4, local batch 2" in rank_0
    assert rank_0.count("Time taken for epoch 1 is") == 1 and "Avg val loss=" in rank_0
    assert "Time taken for epoch" not in rank_1 and "data parallel:" not in rank_1
    procs = _jax_processes(multi, _free_port(), SLURM_RESTART_COUNT="1")
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert f"at epoch 2, step 3 of {steps}" in outs[0][0]
    assert (tmp_path / "multi" / "out.log").read_text().count("Time taken for epoch 1 is") == 1
    np.testing.assert_allclose(_losses(tmp_path / "multi"), _losses(tmp_path / "single"), rtol=LOSS_RTOL)
    a, b = np.load(tmp_path / "single.npz"), np.load(tmp_path / "multi.npz")
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=ATOL, err_msg=k)
