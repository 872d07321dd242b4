"""The weak-scaling model: its all-reduce and overlap arithmetic against hand-derived numbers, its
inputs against the result files they are quoted from, and its command line."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from dlas_compare import scaling_model as sm
from shared_data.core.config import REPO_ROOT, load_config
from shared_data.core.errors import UserError, run_cli
from shared_data.model import unet_spec


def cluster(node_gbps=100.0, nic_gbps=10.0, alpha_node=0.0, alpha_net=0.0, gpus_per_node=8) -> sm.Cluster:
    return sm.Cluster(
        "test",
        gpus_per_node,
        sm.Input(node_gbps, ""),
        sm.Input(nic_gbps, ""),
        sm.Input(alpha_node, ""),
        sm.Input(alpha_net, ""),
    )


def test_ring_allreduce_in_one_node_moves_2_n_minus_1_over_n_of_the_bytes():
    # 1 GB over 8 GPUs at 100 GB/s: each GPU sends 2 * 7/8 GB -> 17.5 ms
    assert sm.allreduce_ms(1e9, 8, cluster()) == pytest.approx(17.5)
    # 2 GPUs: the whole buffer once, 10 ms; one GPU: nothing to sum
    assert sm.allreduce_ms(1e9, 2, cluster()) == pytest.approx(10.0)
    assert sm.allreduce_ms(1e9, 1, cluster()) == 0.0


def test_across_nodes_each_gpu_sends_its_eighth_through_its_own_nic():
    # 2 nodes of 8: 17.5 ms in the node + 2 * 1/2 * (1 GB / 8) / 10 GB/s = 12.5 ms across
    assert sm.allreduce_ms(1e9, 16, cluster()) == pytest.approx(30.0)
    # at half the link rate everything takes twice as long
    assert sm.allreduce_ms(1e9, 16, cluster(), eta=0.5) == pytest.approx(60.0)


def test_latency_is_the_lesser_of_ring_and_tree_per_call():
    c = cluster(alpha_node=1.0, alpha_net=10.0)
    # 512 GPUs = 64 nodes: ring 2 * (512 - 64) * 1 + 2 * 63 * 10 = 2156 us; tree 2 * 7 * 1 + 2 * 6 * 10 = 134 us
    assert sm.allreduce_ms(0.0, 512, c, calls=3) == pytest.approx(3 * 0.134)
    # 16 GPUs = 2 nodes: ring 2 * 14 + 2 * 10 = 48 us; tree 14 + 20 = 34 us
    assert sm.allreduce_ms(0.0, 16, c) == pytest.approx(0.034)
    # 4 GPUs in one node: ring 2 * 3 = 6 us = tree
    assert sm.allreduce_ms(0.0, 4, c) == pytest.approx(0.006)


def test_more_than_one_node_needs_whole_nodes():
    with pytest.raises(UserError, match="12 GPUs: more than one node needs whole nodes of 8"):
        sm.allreduce_ms(1e9, 12, cluster())


def test_overlap_hides_all_but_the_last_bucket_and_what_exceeds_the_window():
    # 8 GPUs at 100 GB/s, 1 GB of float32 gradients (250 M parameters): T = 17.5 ms in 5 buckets
    fw = sm.Framework("x", sm.Input(20.0, ""), sm.Input(0.5, ""), sm.Input(5, ""))
    r = sm.predict(fw, 250_000_000, "float32", 8, cluster(), eta=1.0, c=0.5)
    # overlapped = min(17.5 - 3.5, 0.5 * 20) = 10; exposed 7.5; contention 0.5 * 10 = 5
    assert (r.allreduce, r.exposed, r.contention) == pytest.approx((17.5, 7.5, 5.0))
    assert r.step == pytest.approx(32.5) and r.efficiency == pytest.approx(20 / 32.5)
    # a wide window: only the last bucket (3.5 ms) is exposed; bf16 halves the bytes
    wide = dataclasses.replace(fw, window_share=sm.Input(1.0, ""))
    r = sm.predict(wide, 250_000_000, "bfloat16", 8, cluster(), eta=1.0, c=0.5)
    assert (r.allreduce, r.exposed, r.contention) == pytest.approx((8.75, 1.75, 3.5))


def test_no_window_exposes_the_whole_allreduce_and_slows_nothing():
    r = sm.predict(sm.FRAMEWORKS["tf"], 250_000_000, "float32", 8, cluster(), eta=1.0, c=0.5)
    assert r.exposed == pytest.approx(r.allreduce) and r.contention == 0.0
    assert r.allreduce == pytest.approx(17.5)


def test_ddp_buckets_of_25_mb():
    fw = sm.Framework("ddp", sm.Input(10.0, ""), sm.Input(0.5, ""))
    assert fw.calls(468e6) == 19 and fw.calls(1e6) == 1


def results(path: str) -> str:
    return (REPO_ROOT / path).read_text()


def records(path: str) -> dict:
    return {r["label"]: r for r in map(json.loads, results(path).splitlines())}


def test_the_steps_are_the_recorded_ones():
    final = records("experiments/tf_on_h200/results/compare_final.jsonl")
    for name in ("jax", "tf"):
        record = final[f"{name} synthetic"]
        assert (record["config"], record["mode"], record["global_batch"]) == ("short_opt", "synthetic", 64)
        assert sm.FRAMEWORKS[name].step_ms.value == pytest.approx(1e3 * 64 / record["samples_per_sec"], rel=1e-6)
    scaling = records(sm.SCALING)
    (jax, jax_2), (ddp, ddp_2) = [(fw.step_ms.value, two) for fw, two, _ in sm.CHECKS]
    assert jax == pytest.approx(1e3 * 64 / scaling["jax 1 GPU b64"]["samples_per_sec"], rel=1e-6)
    assert jax_2 == pytest.approx(1e3 * 128 / scaling["jax 2 GPUs local 64"]["samples_per_sec"], rel=1e-6)
    assert ddp == pytest.approx(1e3 * 64 / scaling["torch 1 GPU b64"]["samples_per_sec"], rel=1e-6)
    assert ddp_2 == pytest.approx(1e3 * 128 / scaling["torch DDP 2 GPUs local 64"]["samples_per_sec"], rel=1e-6)


def test_the_allreduce_volume_is_the_parameters_in_bf16_as_xla_sums_them():
    params = unet_spec.num_params(load_config("short_opt"))
    assert 116e6 < params < 118e6
    log = results("experiments/two_gpu_scaling/results/allreduce_schedules.log")
    first = log.split("== lhs:")[0]
    mib = [float(x) for x in re.findall(r"bf16\s+([\d.]+) MiB", first)]
    assert len(mib) == sm.JAX_BUCKETS.value
    assert sum(mib) == pytest.approx(2 * params / 2**20, abs=0.2)  # bf16: 2 bytes per parameter


def test_contention_and_nccl_rate_are_the_timeline_numbers():
    log = results("experiments/two_gpu_scaling/results/timeline_with_without_allreduce.log")
    rows = re.findall(r"/device:GPU:\d\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", log.split("== 2 GPUs\n")[1])
    one = float(re.search(r"== 1 GPU\n.*\n/device:GPU:0\s+([\d.]+)", log).group(1))
    (c0, n0, o0), (c1, n1, o1) = [tuple(map(float, r)) for r in rows]
    assert sm.CONTENTION.value == pytest.approx((c0 - one + c1 - one) / (o0 + o1))
    assert sm.MEASURED_ETA.value * 450 == pytest.approx(223.1 * 2**20 / 1e6 / ((n0 + n1) / 2))


def test_the_windows_are_the_recorded_ones():
    two_gpus = results("experiments/two_gpu_scaling/results/timeline.log").split("== 2 GPUs\n")[1]
    span = float(re.search(r"/device:GPU:0(?:\s+[\d.]+){5}\s+([\d.]+)", two_gpus).group(1))
    first_nccl = float(re.search(r"nccl at\s+([\d.]+) ms", two_gpus).group(1))
    assert sm.JAX_WINDOW.value == pytest.approx((span - first_nccl) / span)
    layers = json.loads(results("experiments/h200_step_breakdown/results/bf16/breakdown.json"))["layers"]
    ms = {role: sum(layer[role]["ms"] for layer in layers.values()) for role in ("fwd", "dgrad", "wgrad")}
    assert sm.BACKWARD_SHARE.value == pytest.approx((ms["dgrad"] + ms["wgrad"]) / sum(ms.values()), abs=1e-3)


def test_the_model_meets_the_measured_two_gpu_runs():
    """JAX at the NCCL rate measured beside compute and DDP at the link rate each land within one
    point of their measured 2-GPU efficiency."""
    params = unet_spec.num_params(load_config("short_opt"))
    (jax, jax_2, jax_dtype), (ddp, ddp_2, ddp_dtype) = sm.CHECKS
    c = sm.CONTENTION.value
    r = sm.predict(jax, params, jax_dtype, 2, sm.H200, sm.MEASURED_ETA.value, c)
    assert r.efficiency == pytest.approx(jax.step_ms.value / jax_2, abs=0.01)
    r = sm.predict(ddp, params, ddp_dtype, 2, sm.H200, 1.0, c)
    assert r.efficiency == pytest.approx(ddp.step_ms.value / ddp_2, abs=0.01)


def test_command_prints_inputs_and_both_tables(capsys):
    assert run_cli(sm.main, ["--gpus", "1", "8", "64"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 116977029" in out and "bandwidth 'link'" in out and "bandwidth 'measured'" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("jax ", "tf "))]
    assert len(rows) == 2 * 2 * 3 * 2  # frameworks x gradient dtypes x GPU counts x bandwidths
    assert all(row[-1] == "100.0%" for row in rows if row[2] == "1")


@pytest.mark.parametrize(
    "argv, message",
    [(["--gpus", "0"], "--gpus 0: GPU counts are positive"), (["--gpus", "12"], "12 GPUs: more than one node")],
)
def test_bad_input_is_one_error_line(argv, message, capsys):
    assert run_cli(sm.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_check_and_tutorial(capsys):
    assert run_cli(sm.main, ["--check"]) == 0
    out = capsys.readouterr().out
    assert "measured 17.90 ms (95.6%)" in out and "measured 34.38 ms (98.4%)" in out
    assert run_cli(sm.main, ["--tutorial"]) == 0
    assert "84% on 128 A100s" in capsys.readouterr().out


@pytest.mark.parametrize("name, argv", [("table", []), ("check", ["--check"]), ("tutorial", ["--tutorial"])])
def test_the_study_records_what_the_command_prints(name, argv, capsys):
    """experiments/scaling_model/results/*.txt are the command's output today (rerun the study's
    commands after changing an input)."""
    assert run_cli(sm.main, argv) == 0
    assert capsys.readouterr().out == results(f"experiments/scaling_model/results/{name}.txt")
