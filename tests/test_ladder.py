"""The ladder: its rung plan on this machine and on hand-made GPU machines, the verdict rule, the
speedups, and one CI-sized real ladder of JAX on the tiny config (records in the benchmark schema,
each rung's cumulative settings, skip reasons, the figure)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import BENCHMARK_KEYS

from dlas_compare import ladder, ladder_budget, ladder_rungs, ladder_schedule, ladder_table, ladder_verdicts
from shared_data.core import config as config_mod
from shared_data.core.errors import run_cli

LADDER_KEYS = {"ladder_id", "ladder_step", "ladder_rung", "ladder_settings", "ladder_xla_flags"}
NO_GPU = "no GPU: "


def _config_args(cfg):
    return ["--config", "cpu_tiny"] + [
        a for k in ("train_path", "val_path", "xla_cache_dir") for a in ("--set", f"{k}={getattr(cfg, k)}")
    ]


@pytest.mark.slow
def test_plan_on_this_machine(tiny_cfg):
    """No GPU here: rungs 1-5 planned for JAX and TF (DALI when its plugin imports), the
    GPU-resident rung skipped for the missing GPU, data parallel on 2 CPU devices, the PyTorch
    reference skipped at every rung."""
    plans = {}
    for fw in ("jax", "tf", "torch"):
        found = ladder_rungs.probe(fw)
        plans[fw] = found, ladder_rungs.plan(fw, found, tiny_cfg)
    for fw in ("jax", "tf"):
        found, steps = plans[fw]
        assert found.reason is None and found.gpus == 0
        assert [s.rung.name for s in steps] == [r.name for r in ladder_rungs.RUNGS]
        assert [s.index for s in steps] == list(range(1, 8))
        dali = steps[2]
        assert (dali.skip is None) == (found.dali is None), dali.skip
        assert all(s.skip is None for s in steps[:2] + steps[3:5])
        assert steps[5].skip.startswith(NO_GPU) and "GPU memory" in steps[5].skip
        assert steps[6].skip is None and (steps[6].settings.num_devices, steps[6].settings.host_devices) == (2, 2)
    if importlib.util.find_spec("nvidia.dali"):
        assert plans["jax"][0].dali is None and plans["jax"][1][2].skip is None  # DALI present: the rung runs
    found, steps = plans["torch"]
    assert found.reason in ("torch is not installed", "the PyTorch reference runs on a GPU only, and torch sees none")
    assert all(s.skip == found.reason for s in steps)


def test_rungs_are_cumulative_and_name_their_flags(tiny_cfg):
    found = ladder_rungs.Probe("jax", gpus=0, devices=1, device="cpu")
    s = [step.settings for step in ladder_rungs.plan("jax", found, tiny_cfg, cpu_count=2)]
    assert s[0] == ladder_rungs.Settings("lowmem", 4, False, False, False, 1, None)
    assert (s[1].num_data_workers, s[1].data_loader_config) == (8, "lowmem")
    assert (s[2].data_loader_config, s[2].num_data_workers, s[2].enable_amp) == ("dali-npy", 8, False)
    assert (s[3].data_loader_config, s[3].enable_amp, s[3].kit_xla_flags) == ("dali-npy", True, False)
    assert (s[4].enable_amp, s[4].enable_jit, s[4].kit_xla_flags) == (True, True, True)
    assert ladder_rungs.benchmark_args(s[0]) == [
        "--data_loader_config",
        "lowmem",
        "--num_data_workers",
        "4",
        "--no-enable_amp",
        "--no-enable_jit",
        "--num_devices",
        "1",
    ]
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert (
        ladder_rungs.xla_flags(s[3], env) == "--xla_force_host_platform_device_count=2 --xla_gpu_force_conv_nhwc=false"
    )
    assert ladder_rungs.xla_flags(s[4], env) == env["XLA_FLAGS"]  # the frameworks add the kit's defaults at import
    steps = ladder_rungs.plan("jax", found, tiny_cfg, cpu_count=2)
    assert steps[1].note == "8 worker threads on 2 cores"
    assert "act on GPU convolutions only" in steps[4].note


def test_data_parallel_rung_runs_on_cpu_devices_in_a_process_of_its_own(tiny_cfg, monkeypatch):
    """No GPU: the data-parallel rung runs on 2 CPU devices (3 with --num_devices 3) at 2 x the
    config's global batch, with the loss check; its process asks XLA for the devices (TF follows the
    same flag), so it is a process of its own in both frameworks."""
    cpu = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    for fw in ("jax", "tf"):
        found = ladder_rungs.Probe(fw, gpus=0, devices=1, device="cpu")
        steps = ladder_rungs.plan(fw, found, tiny_cfg, cpu_count=2)
        dp = steps[6]
        assert dp.skip is None and "correctness, not speed" in dp.note
        assert (dp.settings.num_devices, dp.settings.local_batch_size, dp.settings.host_devices) == (2, 4, 2)
        assert ladder_rungs.benchmark_args(dp.settings)[-6:] == [
            "--num_devices", "2", "--local_batch_size", "4", "--replica_check", "2"
        ]  # fmt: skip
        flags = ladder_rungs.process_xla_flags(dp, cpu)
        assert flags.split()[-1] == "--xla_force_host_platform_device_count=2" and flags.count("device_count") == 1
        assert ladder_rungs.process_xla_flags(steps[4], cpu) != flags
        three = ladder_rungs.plan(fw, found, tiny_cfg, num_devices=3, cpu_count=2)[6].settings
        assert (three.num_devices, three.host_devices) == (3, 3)
    # where the caller's XLA_FLAGS already give 2 CPU devices (as here), TF's rung 7 still starts its own
    # process: TF makes its devices once, at its first rung
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    tf_steps = {"tf": ladder_rungs.plan("tf", ladder_rungs.Probe("tf", devices=1, device="CPU"), tiny_cfg, cpu_count=2)}
    schedule = ladder_schedule.make_schedule(tf_steps, ladder.MODES, ladder_budget.Windows(2, 1.0), None)
    assert [[s.index for s in g] for g in schedule.groups()] == [[1, 2, 3, 4, 5], [7]]


def test_plan_on_gpu_machines(tiny_cfg):
    """Two GPUs: every JAX rung runs, the GPU-resident rung on the DALI rung's settings, data
    parallel on both GPUs with the config's global batch per GPU; the PyTorch reference stops
    after mixed precision; without DALI the next rungs build on the workers rung."""
    two = ladder_rungs.Probe("jax", gpus=2, devices=2, device="NVIDIA H200")
    steps = ladder_rungs.plan("jax", two, tiny_cfg)
    assert all(s.skip is None for s in steps)
    device, dp = steps[5].settings, steps[6].settings
    assert (device.data_loader_config, device.enable_amp, device.num_devices) == ("device", True, 1)
    assert (dp.data_loader_config, dp.num_devices, dp.local_batch_size) == ("device", 2, tiny_cfg.global_batch_size)
    dp_args = ["--num_devices", "2", "--local_batch_size", "4", "--replica_check", "2"]
    assert ladder_rungs.benchmark_args(dp)[-6:] == dp_args
    assert dp.host_devices == 1 and ladder_rungs.process_xla_flags(steps[6], {}) == ""  # GPUs: no CPU devices made

    torch = ladder_rungs.plan("torch", ladder_rungs.Probe("torch", gpus=2, devices=2, device="H200"), tiny_cfg)
    assert [s.skip is None for s in torch] == [True] * 4 + [False] * 3
    assert "torch.compile" in torch[4].skip and "no GPU-resident loader" in torch[5].skip
    assert "torch_ddp" in torch[6].skip

    one = ladder_rungs.Probe("tf", gpus=1, devices=1, device="GPU", dali="DALI's tf plugin does not import here (x)")
    steps = ladder_rungs.plan("tf", one, tiny_cfg)
    assert steps[2].skip == one.dali and steps[3].settings.data_loader_config == "lowmem"
    assert steps[5].skip is None and steps[6].skip.startswith("1 GPU: ")
    assert ladder_rungs.plan("jax", two, tiny_cfg, num_devices=3)[6].skip == "--num_devices 3: jax sees 2 device(s)"

    no_npy = config_mod.replace(tiny_cfg, train_path_npy_data="/nonexistent/x.npy")
    assert ladder_rungs.plan("jax", two, no_npy)[2].skip.startswith("no .npy twin /nonexistent/x.npy")


def test_verdict_rule_on_hand_made_numbers():
    """Input-bound when FULL < 0.8 x SYNTHETIC and IO < SYNTHETIC; compute-bound otherwise; unreliable
    when FULL > 1.1 x IO."""
    assert ladder_verdicts.verdict(75, 100, 79)[0] == "input-bound"
    assert ladder_verdicts.verdict(75, 100, 80)[0] == "compute-bound"  # 80 is not below 0.8 x 100
    assert ladder_verdicts.verdict(50, 100, 79)[0] == "unreliable"  # 79 > 1.1 x 50
    bound, why = ladder_verdicts.verdict(150, 100, 50)
    assert bound == "compute-bound" and "contend" in why  # the pipeline alone keeps up
    assert ladder_verdicts.verdict(None, 100, 50) == (
        "input-bound",
        "FULL 50.0 < 0.8 x SYNTHETIC 100.0 and IO not measured",
    )
    assert ladder_verdicts.verdict(100, 100, 79)[0] == "compute-bound"  # IO equal to SYNTHETIC is not below it
    assert ladder_verdicts.verdict(50, None, 40)[0] is None
    assert (
        ladder_verdicts.effect(1.06) == "faster"
        and "slowed" in ladder_verdicts.effect(0.94)
        and "no change" in ladder_verdicts.effect(1.04)
    )


def test_summaries_compute_speedups_over_the_last_rung_that_ran(tiny_cfg):
    steps = ladder_rungs.plan("jax", ladder_rungs.Probe("jax", gpus=2, devices=2, device="H200"), tiny_cfg)
    rec = lambda mode, v: {"mode": mode, "samples_per_sec": v, "samples_per_sec_min": v - 1,
                           "samples_per_sec_max": v + 1, "device": "1 x H200", "global_batch": 4}  # fmt: skip
    ran = []
    base = ladder_verdicts.summarize(
        steps[0], [rec("io", 30), rec("synthetic", 100), rec("full", 20)], "ran", None, ran
    )
    assert (base["speedup_vs_baseline"], base["speedup_vs_previous"], base["verdict"]) == (1.0, None, "input-bound")
    ran.append(base)
    skipped = ladder_verdicts.summarize(steps[1], [], "skipped", "why", ran)
    assert skipped["status"] == "skipped" and skipped["speedup_vs_baseline"] is None and "why" in skipped["line"]
    dali = ladder_verdicts.summarize(
        steps[2], [rec("io", 500), rec("synthetic", 110), rec("full", 90)], "ran", None, ran
    )
    assert dali["speedup_vs_baseline"] == dali["speedup_vs_previous"] == 4.5 and dali["previous_rung"] == "baseline"
    assert dali["verdict"] == "compute-bound" and "was input-bound: the bottleneck moved" in dali["line"]
    ran.append(dali)
    amp = ladder_verdicts.summarize(
        steps[3], [rec("io", 500), rec("synthetic", 200), rec("full", 45)], "ran", None, ran
    )
    assert (amp["speedup_vs_baseline"], amp["speedup_vs_previous"]) == (2.25, 0.5)
    assert "x0.50 over DALI (this rung slowed FULL down here)" in amp["line"]
    assert amp["verdict"] == "compute-bound" and "contend" in amp["verdict_reason"]
    ran.append(amp)
    # rungs 1 and 3 ran the same train step (only the input differs): their SYNTHETIC spread is noise
    assert ladder_table.noise_lines(ran) == [
        "jax: SYNTHETIC of rungs 1, 3 (one train step, only the input differs) spans 100.0-110.0 samples/s "
        "(x1.10): ratios within that spread are this machine's noise"
    ]


def test_user_errors(tiny_cfg, capsys):
    args = ["--frameworks", "jax", *_config_args(tiny_cfg)]
    assert run_cli(ladder.main, args + ["--num_data_workers", "3"]) == 2
    assert run_cli(ladder.main, args + ["--set", "enable_amp=true"]) == 2
    assert run_cli(ladder.main, args + ["--modes", "io", "synthetic"]) == 2
    assert run_cli(ladder.main, args + ["--set", "train_path=/nonexistent.h5"]) == 2
    assert run_cli(ladder.main, args + ["--resume", "/nonexistent.jsonl"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "error: num_data_workers is set by the ladder's rungs; leave it out (they own data_loader_config, "
        "num_data_workers, enable_amp, enable_jit, local_batch_size)"
    )
    assert err[1].startswith("error: enable_amp is set by the ladder's rungs")
    assert err[2] == "error: --modes must include full: the ladder's speedups are FULL samples/s"
    assert err[3] == (  # the kit's command, with the twins the DALI rung reads (cpu_tiny: 4 crops of 16 a side)
        "error: config 'cpu_tiny' reads /nonexistent.h5, which does not exist "
        "(python -m shared_data.data.generate --out /nonexistent.h5 --size 64 --seed 1 --npy)"
    )
    assert err[4] == (
        "error: --resume /nonexistent.jsonl: expected a JSON lines file written by the ladder "
        "([Errno 2] No such file or directory: '/nonexistent.jsonl')"
    )


def test_the_data_parallel_rung_reports_replicas_batch_losses_and_their_difference():
    check = dict(replicas=2, global_batch=8, steps=2, losses_one_device=[0.03708900, 0.03305335], rtol=1e-5)
    equal = dict(check, losses_replicas=[0.03708900, 0.03305337], max_rel_diff=6.1e-7, equal=True)
    assert ladder_verdicts.replica_line(equal) == (
        "2 replicas, global batch 8: the losses of 2 steps equal one device's (1 device/replicas: "
        "0.037089/0.037089, 0.03305335/0.03305337; max relative difference 6.1e-07, within 1e-05)"
    )
    differ = dict(check, losses_replicas=[0.03708900, 0.03308612], max_rel_diff=9.9e-4, equal=False)
    assert ladder_verdicts.replica_line(differ) == (
        "2 replicas, global batch 8: the losses of 2 steps NOT equal to one device's (1 device/replicas: "
        "0.037089/0.037089, 0.03305335/0.03308612; max relative difference 9.9e-04, over 1e-05)"
    )


@pytest.mark.slow  # seconds of real waiting: the fast tier stays under a minute
def test_spent_budget_skips_the_rungs(tiny_cfg, tmp_path):
    out = tmp_path / "ladder.jsonl"
    args = ["--frameworks", "jax", *_config_args(tiny_cfg), "--budget_sec", "0.001", "--out", str(out)]
    assert ladder.main(args) == 0
    summaries = [json.loads(line) for line in out.read_text().splitlines()]
    budget = "the ladder's time budget (--budget_sec 0) was spent"
    assert [s["reason"] for s in summaries[:5]] == [budget] * 5 and summaries[6]["reason"] == budget
    assert all(s["status"] == "skipped" for s in summaries) and summaries[5]["reason"].startswith(NO_GPU)
    assert (tmp_path / "ladder.png").is_file()  # the figure beside --out by default


@pytest.mark.slow
def test_ci_sized_ladder_of_jax_on_cpu(tiny_cfg, tmp_path, capsys):
    """The real command, JAX only, 1 + 2 x 2 steps per mode: every rung that can run here writes the
    records of the modes its change moves in the benchmark schema with its cumulative settings, every
    rung a summary whose speedups are the records' FULL ratios, and the figure; the data-parallel
    rung on 2 CPU devices at twice the batch, with its loss check against one device: the rung
    inherits bfloat16 compute from the AMP rung, and its losses still equal one device's within
    1e-5 (the same crops; float32 gradient sums in another order)."""
    out, fig = tmp_path / "ladder.jsonl", tmp_path / "ladder.png"
    args = ["--frameworks", "jax", *_config_args(tiny_cfg), "--warmup", "1", "--steps", "2", "--windows", "2"]
    assert ladder.main(args + ["--window_sec", "60", "--out", str(out), "--figure", str(fig)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    bench = [r for r in records if "mode" in r]
    summaries = [r for r in records if r.get("record") == "ladder_summary"]
    changed = {1: ladder.MODES, 2: ("io", "full"), 3: ("io", "full"), 4: ("synthetic", "full")}
    changed[5], changed[7] = ("synthetic", "full"), ladder.MODES
    ran = [1, 2, 3, 4, 5, 7]
    assert [(r["ladder_step"], r["mode"]) for r in bench] == [(i, m) for i in ran for m in changed[i]]
    for r in bench:
        assert set(r) >= BENCHMARK_KEYS | LADDER_KEYS and r["framework"] == "jax" and r["config"] == "cpu_tiny"
        replicas = 2 if r["ladder_step"] == 7 else 1
        assert r["samples_per_sec"] > 0 and r["global_batch"] == replicas * tiny_cfg.global_batch_size
        assert r["device"] == f"{replicas} x cpu"
        assert r["window_sec"] == 60 and r["window_steps"] == [2, 2]
    full = {r["ladder_step"]: r for r in bench if r["mode"] == "full"}
    cv = lambda i, key: full[i]["config_values"][key]
    assert (full[1]["loader"], full[1]["precision"], cv(1, "num_data_workers"), cv(1, "enable_jit")) == (
        "lowmem",
        "float32",
        4,
        False,
    )
    assert full[1]["ladder_xla_flags"].endswith("--xla_gpu_force_conv_nhwc=false")
    assert (full[2]["loader"], cv(2, "num_data_workers")) == ("lowmem", 8)
    assert (full[3]["loader"], full[3]["precision"]) == ("dali-npy", "float32")
    assert (full[4]["loader"], full[4]["precision"]) == ("dali-npy", "bfloat16")
    assert (full[5]["precision"], cv(5, "enable_jit")) == ("bfloat16", True)
    assert "--xla_gpu_force_conv_nhwc=false" not in full[5]["ladder_xla_flags"]  # the kit's flags are on

    assert [(s["ladder_step"], s["status"]) for s in summaries] == [(i, "ran") for i in range(1, 6)] + [
        (6, "skipped"),
        (7, "ran"),
    ]
    assert summaries[5]["reason"].startswith(NO_GPU)
    assert full[7]["ladder_xla_flags"].endswith("--xla_force_host_platform_device_count=2")
    check = full[7]["replica_check"]
    assert (check["replicas"], check["global_batch"], check["steps"]) == (2, 2 * tiny_cfg.global_batch_size, 2)
    assert summaries[6]["replicas"] == 2 and summaries[6]["replica_check"] == check
    assert full[7]["precision"] == "bfloat16" and full[7]["global_batch"] == check["global_batch"]
    pairs = list(zip(check["losses_one_device"], check["losses_replicas"]))
    assert len(pairs) == 2 and all(0 < a < 1 for a, _ in pairs)  # L1 of tanh outputs
    assert check["max_rel_diff"] == max(abs(a - b) / a for a, b in pairs)
    assert check["equal"] and check["max_rel_diff"] < 1e-5, check
    assert ladder_verdicts.replica_line(check) in summaries[6]["line"]
    assert f"2 replicas, global batch {check['global_batch']}: the losses of 2 steps equal" in summaries[6]["line"]
    rate = lambda i: full[i]["samples_per_sec"]
    for s in summaries[:5] + summaries[6:]:
        i = s["ladder_step"]
        assert s["full_samples_per_sec"] == rate(i)
        assert s["speedup_vs_baseline"] == pytest.approx(rate(i) / rate(1))
        prev = max((j for j in ran if j < i), default=None)
        assert s["speedup_vs_previous"] == (None if i == 1 else pytest.approx(rate(i) / rate(prev)))
        measured = {r["mode"]: r["samples_per_sec"] for r in bench if r["ladder_step"] == i}
        assert s["measured_modes"] == list(changed[i])
        for mode in ladder.MODES:  # a mode the rung did not measure is the last rung's that did
            at = max(j for j in ran if j <= i and mode in changed[j])
            value = next(r["samples_per_sec"] for r in bench if (r["ladder_step"], r["mode"]) == (at, mode))
            assert (s["values_from"][mode], s[f"{mode}_samples_per_sec"]) == (at, value)
        assert (
            s["verdict"] == ladder_verdicts.verdict(s["io_samples_per_sec"], s["synthetic_samples_per_sec"], rate(i))[0]
        )
        assert measured["full"] == rate(i)
    printed = capsys.readouterr().out
    assert "jax       3 DALI" in printed and "skipped: no GPU" in printed
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    again = tmp_path / "again.png"
    assert ladder.main(["--replot", str(out), "--figure", str(again)]) == 0
    assert again.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rung_group_echoes_its_process_and_reports_each_rung_as_it_comes(tiny_cfg, monkeypatch, capsys):
    """run_group hands run_process a line prefix to echo the benchmark's stages live and the caller's
    ``progress`` callback (called with the records so far), each in its own parameter."""
    from dlas_compare import ladder_runner

    found = ladder_rungs.Probe("jax", gpus=0, devices=1, device="cpu")
    steps = ladder_rungs.plan("jax", found, tiny_cfg, cpu_count=2)[:1]
    seen = {}

    def fake_run_process(cmd, out, timeout, env=None, echo=None, progress=None):
        seen.update(echo=echo, progress=progress)
        progress([{"ladder_step": 1, "mode": "io"}])
        return [{"ladder_step": 1, "mode": "io"}], None, "[benchmark] io done\n"

    monkeypatch.setattr(ladder_runner, "run_process", fake_run_process)
    got = []
    records, failure, _ = ladder_runner.run_group(steps, [["io"]], _config_args(tiny_cfg), 60, progress=got.append)
    assert seen["echo"] == "[ladder]     " and seen["progress"] == got.append
    assert got == [[{"ladder_step": 1, "mode": "io"}]] and failure is None
    assert records == [{"ladder_step": 1, "mode": "io"}]
    assert "<function" not in capsys.readouterr().out
