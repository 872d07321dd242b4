"""The step-fusion study's bookkeeping (experiments/step_fusion/table.py) on hand-made breakdowns: each
variant's record and failure reason, the combination of the winners, the table's MFU and deltas."""

from __future__ import annotations

import json
import runpy
import types

import pytest

from shared_data.core.config import REPO_ROOT

pytestmark = pytest.mark.study


@pytest.fixture(scope="module")
def table():
    """The study's table.py (a script, not a package module) as a namespace of its functions."""
    return types.SimpleNamespace(**runpy.run_path(str(REPO_ROOT / "experiments" / "step_fusion" / "table.py")))


def breakdown(step_ms, conv_ms, d2s_ms, adam_ms):
    return {
        "device": "1 x NVIDIA H200", "precision": "bfloat16", "config": "short_opt", "batch": 64, "steps": 10,
        "step_s": step_ms / 1e3, "samples_per_sec": 64e3 / step_ms,
        "totals": {"conv_ms": conv_ms, "other_ms": d2s_ms + adam_ms, "model_gflop": 5218.4},
        "kinds": {"depth-to-space shuffles": {"ms": d2s_ms}, "Adam": {"ms": adam_ms}},
    }  # fmt: skip


def variant(root, table, index, name, sets="", flags="", rc=0, bd=None, stderr="", skipped=None):
    folder = root / f"{index:02d}_{name}"
    folder.mkdir()
    if bd is not None:
        (folder / "breakdown.json").write_text(json.dumps(bd))
    (folder / "stderr.log").write_text(stderr)
    argv = ["record", str(folder), "--index", str(index), "--name", name, f"--sets={sets}", f"--flags={flags}"]
    argv += ["--rc", str(rc), "--wall_s", "30"] + (["--skipped", skipped] if skipped else [])
    assert table.main(argv) == 0
    return json.loads((folder / "variant.json").read_text())


@pytest.fixture
def call(tmp_path, table):
    """A call's variants: baseline 13 ms; two winners that both set upconv; noise; a failure; a skip."""
    v = [
        variant(tmp_path, table, 1, "baseline", bd=breakdown(13.0, 9.0, 1.3, 0.9)),
        variant(tmp_path, table, 2, "fuse", flags="--xla_a=true", bd=breakdown(12.0, 8.6, 1.3, 0.9)),
        variant(tmp_path, table, 3, "phases", sets="upconv=phases pad_out_channels=16",
                bd=breakdown(12.5, 9.0, 1.0, 0.9)),
        variant(tmp_path, table, 4, "crop", sets="upconv=subpixel", flags="--xla_a=false",
                bd=breakdown(12.8, 9.0, 1.2, 0.9)),
        variant(tmp_path, table, 5, "noise", sets="adam_update=flat", bd=breakdown(12.9, 9.0, 1.3, 0.8)),
        variant(tmp_path, table, 6, "bad", flags="--xla_b=true", rc=134,
                stderr="W0000 chatter\nF1203 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --xla_b=true\n"),
        variant(tmp_path, table, 7, "late", sets="skip_concat=split", skipped="no time left"),
        variant(tmp_path, table, 8, "baseline_repeat", bd=breakdown(11.0, 9.0, 1.3, 0.9)),
    ]  # fmt: skip
    return tmp_path, v


def test_records_say_ok_failed_timed_out_or_skipped_with_the_reason(call, table, tmp_path):
    _, v = call
    assert [r["status"] for r in v] == ["ok", "ok", "ok", "ok", "ok", "failed", "skipped", "ok"]
    assert v[5]["reason"] == "F1203 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --xla_b=true"
    assert v[6]["reason"] == "no time left" and v[2]["sets"] == ["upconv=phases", "pad_out_channels=16"]
    assert variant(tmp_path, table, 9, "slow", rc=124, stderr="step compiled\n")["status"] == "timed out"
    assert variant(tmp_path, table, 10, "quiet", rc=0)["status"] == "failed"  # exit 0 but no breakdown.json


def test_combination_takes_winners_above_one_percent_the_faster_value_on_a_conflict(call, table, capsys):
    root, v = call
    combo = table.combination(table.load(root))
    # gains 1.0, 0.5, 0.2 ms > 0.13 ms (1% of 13); noise 0.1 ms; the repeat is no lever
    assert combo["winners"] == ["fuse", "phases", "crop"]
    assert combo["sets"] == ["upconv=phases", "pad_out_channels=16"] and combo["flags"] == ["--xla_a=true"]
    assert table.main(["combination", str(root)]) == 0
    assert capsys.readouterr().out.strip() == "upconv=phases pad_out_channels=16|--xla_a=true|fuse,phases,crop"
    (root / "01_baseline" / "variant.json").unlink()
    with pytest.raises(SystemExit, match="the baseline has no step time"):
        table.combination(table.load(root))


def test_table_gives_mfu_both_ways_and_changes_against_the_baseline(call, table):
    root, _ = call
    text = table.table(table.load(root))
    rows = {}
    for line in (ln for ln in text.splitlines() if ln.startswith("| ")):  # the first table's rows
        rows.setdefault(line.split(" | ")[0].strip("| "), line.split(" | "))
    # 5218.4 GFLOP in 12.0 ms: 434.9 TFLOP/s, 44.0% of 989.4, 55.2% of 788
    assert rows["fuse"][1:7] == ["ok", "12.00", "-1.00 ms", "5333.3", "44.0%", "55.2%"]
    assert rows["baseline"][2:6] == ["13.00", "", "4923.1", "40.6%"]
    assert rows["bad"][1] == "failed" and rows["late"][1] == "skipped"
    # the change table: phases' depth-to-space 1.0 - 1.3 ms; its all other 1.9 - 2.2 ms
    changes = [line for line in text.splitlines() if line.startswith("| phases | -0.50")]
    assert changes and changes[0].split(" | ")[1:4] == ["-0.50", "+0.00", "-0.30"]
    assert "- bad: --xla_b=true: failed (rc 134, 30 s): F1203" in text
    assert "winners (> 1% faster than the baseline): fuse (-1.00 ms), phases (-0.50 ms), crop (-0.20 ms)" in text
