"""The MFU study's driver (experiments/h200_mfu/levers.py) on CPU: the combination it picks from hand-made
records, the bookkeeping of a variant that ended its process or would pass the deadline, the table."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from shared_data.core.config import REPO_ROOT

pytestmark = pytest.mark.study


@pytest.fixture(scope="module")
def levers():
    spec = importlib.util.spec_from_file_location("levers", REPO_ROOT / "experiments" / "h200_mfu" / "levers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rec(variant, ms, framework="jax"):
    return {"label": f"{framework} {variant}", "variant": variant, "framework": framework, "step_ms_p50": ms,
            "step_ms_p90": ms + 0.1, "samples_per_sec": 64e3 / ms, "mfu": 0.3, "compile_sec": 20.0}  # fmt: skip


def test_choose_takes_the_levers_above_noise_and_the_fastest_upconv(levers):
    records = [
        rec("baseline", 17.0),
        rec("upconv=subpixel_crop", 15.5),  # -1.5 ms
        rec("upconv=transpose", 15.0),  # -2.0 ms: the faster up-conv form wins
        rec("conv_pad=folded", 16.5),  # -0.5 ms > 1% of 17
        rec("kernel_regroup=transpose", 16.9),  # -0.1 ms: noise
        rec("skip_concat=split", 17.5),  # slower
        rec("command_buffers", 16.0),
        {"label": "jax adam_update=flat", "variant": "adam_update=flat", "framework": "jax", "failure": "x"},
        rec("baseline", 10.0, framework="tf"),  # other frameworks are not the baseline
    ]
    best = levers.choose(records)
    assert best["overrides"] == {"conv_pad": "folded", "upconv": "transpose"}
    assert best["levers"] == ["command_buffers", "conv_pad=folded", "upconv=transpose"]
    assert best["xla_flags"] == levers.COMMAND_BUFFER_FLAGS
    assert best["gain_ms"]["skip_concat=split"] == pytest.approx(-0.5) and best["baseline_ms"] == 17.0
    assert levers.overrides_of("best", "tf", best) == {"conv_pad": "folded", "upconv": "transpose"}
    with pytest.raises(SystemExit, match="no measured JAX baseline"):
        levers.choose(records[1:])


def test_a_variant_that_ended_its_process_or_misses_the_deadline_is_recorded_not_run(levers, tmp_path):
    out = tmp_path / "jax.jsonl"
    out.with_name("jax.jsonl.started").write_text("jax baseline\n")
    argv = ["run", "--config", "cpu_tiny", "--variants", "baseline", "skip_concat=split", "--out", str(out)]
    assert levers.main([*argv, "--deadline", str(time.time() - 1)]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["label"], r["failure"].split(":")[0]) for r in got] == [
        ("jax baseline", "the process ended during this variant"),
        ("jax skip_concat=split", "skipped"),
    ]
    assert levers.main(argv) == 0 and len(out.read_text().splitlines()) == 2  # recorded variants are not rerun
    with pytest.raises(SystemExit, match="unknown variant 'nope'"):
        levers.overrides_of("nope", "jax", None)


def test_table_lists_steps_against_the_jax_baseline_and_failures(levers):
    text = levers.table([rec("baseline", 17.0), rec("best", 13.0), {"label": "tf best", "failure": "boom"}], [])
    lines = text.splitlines()
    assert "-4.00 ms" in lines[3] and "13.00/13.10" in lines[3] and "30.0%" in lines[3]
    assert lines[4].split() == ["tf", "best", "boom"]


def test_every_variant_starts_from_the_default_forms_whatever_the_config_holds(levers, tmp_path, monkeypatch):
    seen = []

    def make_bench(framework, cfg, mode):
        seen.append((cfg.upconv, cfg.conv_pad, cfg.kernel_regroup, cfg.pad_out_channels))
        raise RuntimeError("not built in this test")

    monkeypatch.setattr(levers, "make_bench", make_bench)
    forms = ["--set", "upconv=subpixel_crop", "--set", "conv_pad=folded", "--set", "pad_out_channels=8"]
    argv = ["run", "--config", "cpu_tiny", *forms, "--variants", "baseline", "kernel_regroup=transpose"]
    assert levers.main([*argv, "--out", str(tmp_path / "jax.jsonl")]) == 0
    assert seen == [("subpixel", "separate", "gather", 0), ("subpixel", "separate", "transpose", 0)]
