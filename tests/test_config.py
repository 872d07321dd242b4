from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from conftest import assert_one_error_line, run_in_process

from shared_data.core import config as config_mod
from shared_data.core import config_checks, config_cli, config_schema
from shared_data.core.commands import check_arguments
from shared_data.core.errors import ConfigError


def test_every_named_config_loads_and_is_frozen():
    names = config_mod.config_names()
    for required in (
        "base",
        "short",
        "short_opt",
        "quality",
        "quality_nonlinear",
        "bs64_opt",
        "bs256_opt",
        "bs512_opt",
        "bs2048_opt",
        "cpu_default",
        "cpu_tiny",
    ):
        assert required in names
    for name in names:
        cfg = config_mod.load_config(name)
        assert cfg.name == name
    cfg = config_mod.load_config("short")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_epochs = 3  # type: ignore[misc]


def test_overlays_inherit_from_base():
    base, short, opt = (
        config_mod.load_config("base"),
        config_mod.load_config("short"),
        config_mod.load_config("short_opt"),
    )
    assert short.num_epochs == 4 and short.Nsamples == 512
    assert short.unet_widths == base.unet_widths == (64, 128, 256, 512, 512, 512)
    assert opt.enable_amp and opt.precision == "bfloat16" and opt.Nsamples == 512
    assert base.precision == "float32"
    assert config_mod.load_config("bs256_opt").global_batch_size == 256


def _changed(base: str, name: str) -> dict:
    """The values of config ``name`` that differ from config ``base``'s, by key."""
    a, b = config_mod.load_config(base), config_mod.load_config(name)
    return {
        f.name: getattr(b, f.name)
        for f in dataclasses.fields(b)
        if f.name != "name" and getattr(b, f.name) != getattr(a, f.name)
    }


def test_quality_is_short_opt_with_the_time_to_quality_recipe():
    """``quality`` differs from ``short_opt`` in the recipe of the time-to-quality runs alone: the
    linear gas's files (no non-ML condition, which that gas meets by construction), the `device`
    loader, 6 epochs of 65536 crops, start_lr 1e-3, physical-units loss with the Fourier L1 on the
    scored channels, EMA, an evaluation every epoch and a 10-minute budget."""
    assert _changed("short_opt", "quality") == {
        "train_path": "data/train_256_filtered.h5",
        "val_path": "data/val_128_filtered.h5",
        "quality_beat_non_ml": False,
        "data_loader_config": "device",
        "Nsamples": 65536,
        "num_epochs": 6,
        "start_lr": 1e-3,
        "loss_space": "physical",
        "lambda_fourier": 1.0,
        "fourier_channels": "scored",
        "ema_decay": 0.99,
        "quality_every_epochs": 1,
        "quality_budget_sec": 600.0,
    }


def test_quality_nonlinear_is_quality_on_the_default_gas_with_its_own_target():
    """``quality_nonlinear`` differs from ``quality`` in the default data's files with the non-ML
    condition on for the temperature alone, the loss in log space, the curves' 28-epoch schedule and
    the per-channel thresholds chosen from those curves."""
    assert _changed("quality", "quality_nonlinear") == {
        "train_path": "data/train_256.h5",
        "val_path": "data/val_128.h5",
        "quality_beat_non_ml": True,
        "quality_density_beat_non_ml": False,
        "loss_space": "log",
        "num_epochs": 28,
        "quality_r_min": 0.97,
        "quality_ratio_tol": 0.17,
        "quality_temperature_r_min": 0.69,
        "quality_temperature_ratio_tol": 0.48,
    }


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def _base_with(tmp_path, extra):
    src = config_mod.DEFAULT_YAML.read_text()
    return _write(tmp_path, src + "\nbad:\n  <<: *base\n" + extra)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("  num_epoch: 3\n", r"c\.yaml \[bad\]: unknown key 'num_epoch'"),
        ("  num_epochs: three\n", r"\[bad\] key 'num_epochs': expected integer, got 'three'"),
        ("  enable_amp: 1\n", r"key 'enable_amp': expected boolean"),
        ("  unet_widths: 64\n", r"key 'unet_widths': expected list of integer"),
        ("  data_loader_config: fast\n", r"'data_loader_config': expected one of synthetic, inmem"),
    ],
)
def test_a_bad_key_or_value_names_file_section_and_key(tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        config_mod.load_config("bad", _base_with(tmp_path, extra))


def test_missing_key_missing_name_missing_file(tmp_path):
    p = _write(tmp_path, "only:\n  num_epochs: 1\n")
    with pytest.raises(ConfigError, match=r"\[only\]: missing key 'train_path'"):
        config_mod.load_config("only", p)
    with pytest.raises(ConfigError, match=r"config 'nope' not found in .*UNet\.yaml \(available: .*short"):
        config_mod.load_config("nope")
    with pytest.raises(ConfigError, match=r"config file .*missing\.yaml not found"):
        config_mod.load_config("base", tmp_path / "missing.yaml")


def test_crop_must_divide_by_levels():
    with pytest.raises(ConfigError, match=r"'crop_size': 48 must be divisible by 2\*\*6"):
        config_mod.load_config("base", overrides={"crop_size": 48})
    assert config_mod.load_config("base", overrides={"crop_size": 32, "full_scale": False}).crop_size == 32


@pytest.mark.parametrize("key", ["num_epochs", "upconv_transpose_below", "downconv_strided_below"])
def test_counts_must_not_be_negative(key):
    with pytest.raises(ConfigError, match=rf"key '{key}': expected an integer >= 0, got -1"):
        config_mod.replace(config_mod.load_config("cpu_tiny"), **{key: -1})


def test_cli_flags_and_set_overrides():
    parser = argparse.ArgumentParser()
    config_cli.add_config_args(parser)
    args = parser.parse_args(
        [
            "--config",
            "short",
            "--num_epochs",
            "2",
            "--enable_amp",
            "--data_loader_config",
            "lowmem",
            "--set",
            "unet_widths=[8, 16]",
            "--set",
            "full_scale=false",
            "--set",
            "crop_size=8",
            "--set",
            "lambda_rho=0.5",
            "--set",
            "local_batch_size=null",
        ]
    )
    cfg = config_cli.config_from_args(args)
    assert (cfg.num_epochs, cfg.enable_amp, cfg.data_loader_config) == (2, True, "lowmem")
    assert cfg.unet_widths == (8, 16) and cfg.full_scale is False and cfg.lambda_rho == 0.5
    with pytest.raises(ConfigError, match=r"override 'nope=1': unknown key 'nope'"):
        config_cli.parse_override("nope=1")
    with pytest.raises(ConfigError, match=r"expected KEY=VALUE"):
        config_cli.parse_override("num_epochs")
    args = parser.parse_args(["--config", "short", "--set", "num_epochs=2.5"])
    with pytest.raises(ConfigError, match=r"key 'num_epochs': expected integer, got 2\.5"):
        config_cli.config_from_args(args)


def test_batch_sizes_and_steps():
    cfg = config_mod.load_config("base")
    assert config_mod.batch_sizes(cfg, 1) == (64, 64)
    assert config_mod.batch_sizes(cfg, 4) == (64, 16)
    with pytest.raises(ConfigError, match=r"global_batch_size 64 does not divide over 3 replicas"):
        config_mod.batch_sizes(cfg, 3)
    local = config_mod.replace(cfg, local_batch_size=16)
    assert config_mod.batch_sizes(local, 3) == (48, 16)
    assert config_mod.steps_per_epoch(cfg) == 2048 // 64
    assert config_mod.val_steps(config_mod.replace(cfg, Nsamples_val=65)) == 2
    with pytest.raises(ConfigError, match=r"Nsamples 32 is smaller than one global batch \(64\)"):
        config_mod.steps_per_epoch(config_mod.replace(cfg, Nsamples=32))


# The sections and keys of the NERSC sc21-dl-tutorial's config/UNet.yaml (its own format: nested
# lr_schedule and weight_init, data_size, expdir, box_size, the .npy paths, 'None' strings).
TUTORIAL_YAML = """
base: &base
  weight_init: {conv_init: 'normal', conv_scale: 0.02, conv_bias: 0.}
  lambda_rho: 0
  full_scale: True
  global_batch_size: 64
  base_batch_size: 64
  Nsamples: 65536
  Nsamples_val: 8192
  num_epochs: 10
  enable_amp: False
  enable_apex: False
  enable_benchy: False
  enable_jit: False
  expdir: '/logs'
  lr_schedule: {scaling: 'sqrt', start_lr: 2.E-4, end_lr: 0., warmup_steps: 128}
  data_loader_config: 'lowmem'
  box_size: [1024, 512]
  data_size: 64
  num_data_workers: 2
  N_out_channels: 5
  train_path: '/data/downsamp_2048crop_train.h5'
  val_path: '/data/downsamp_1024crop_valid.h5'
  train_path_npy_data: '/data/downsamp_2048crop_train_data.npy'
  train_path_npy_label: '/data/downsamp_2048crop_train_label.npy'
  val_path_npy_data: '/data/downsamp_1024crop_valid_data.npy'
  val_path_npy_label: '/data/downsamp_1024crop_valid_label.npy'
  use_cache: None
short: &short
  <<: *base
  Nsamples: 4096
  Nsamples_val: 512
  num_epochs: 4
short_opt:
  <<: *short
  data_loader_config: 'dali-lowmem'
  enable_amp: True
  enable_apex: True
  enable_jit: True
bs64_opt: &bs64_opt
  <<: *base
  data_loader_config: 'dali-lowmem'
  global_batch_size: 64
  enable_amp: True
  enable_apex: True
  enable_jit: True
bs256_opt:
  <<: *bs64_opt
  global_batch_size: 256
  num_epochs: 20
bs512_test:
  <<: *bs64_opt
  global_batch_size: 512
bs8192_opt:
  <<: *bs64_opt
  global_batch_size: 8192
  num_epochs: 320
"""


def test_the_tutorials_yaml_loads_unchanged(tmp_path):
    """Every section of the tutorial's file loads; each tutorial key is mapped or reported as not
    applicable in one note; the keys it lacks take the kit's base values."""
    path = tmp_path / "UNet.yaml"
    path.write_text(TUTORIAL_YAML)
    for name in config_mod.config_names(path):
        config_mod.load_config(name, path)
    cfg = config_mod.load_config("short_opt", path)
    assert (cfg.crop_size, cfg.exp_dir, cfg.lr_scaling, cfg.start_lr, cfg.end_lr, cfg.warmup_steps) == (
        64,
        "runs",  # the tutorial's container folder /logs is not written: runs stay under the current folder
        "sqrt",
        2e-4,
        0.0,
        128,
    )
    assert (cfg.data_loader_config, cfg.enable_amp, cfg.enable_jit, cfg.Nsamples, cfg.num_epochs) == (
        "dali-lowmem",
        True,
        True,
        4096,
        4,
    )
    assert cfg.npy_files("train") == (
        Path("/data/downsamp_2048crop_train_data.npy"),
        Path("/data/downsamp_2048crop_train_label.npy"),
    )
    assert cfg.symmetry_group == config_mod.load_config("base").symmetry_group  # not in the tutorial's file
    notes = "\n".join(cfg.notes)
    for key in (
        "data_size",
        "expdir",
        "lr_schedule",
        "weight_init",
        "enable_apex",
        "enable_benchy",
        "box_size",
        "use_cache",
    ):
        assert f"tutorial key '{key}'" in notes, key
    assert "take this kit's base values" in notes
    bad = tmp_path / "bad.yaml"
    bad.write_text(TUTORIAL_YAML.replace("conv_scale: 0.02", "conv_scale: 0.1"))
    with pytest.raises(ConfigError, match=r"key 'weight_init': .* is not supported; this kit initialises"):
        config_mod.load_config("base", bad)


@pytest.mark.parametrize(
    "line, texts",
    [
        (
            "  weight_init: normal",
            ("key 'weight_init'", "expected a mapping of conv_init, conv_scale, conv_bias", "'normal'"),
        ),
        ("  weight_init: [normal, 0.02]", ("key 'weight_init'", "expected a mapping", "['normal', 0.02]")),
        ("  weight_init: {scale: 0.02}", ("key 'weight_init'", "unknown entry 'scale'")),
        ("  lr_schedule: [sqrt, 2.E-4]", ("key 'lr_schedule'", "expected a mapping of scaling, start_lr", "['sqrt'")),
        (
            "  lr_schedule: {scaling: 'sqrt', start_lr: fast}",
            ("key 'lr_schedule.start_lr'", "expected number, got 'fast'"),
        ),
        ("  data_size: [64]", ("key 'data_size' (this kit's crop_size)", "expected integer, got [64]")),
        ("  expdir: [logs]", ("key 'expdir' (this kit's exp_dir)", "expected string, got ['logs']")),
        ("  enable_apex: 'yes'", ("key 'enable_apex'", "expected boolean, got 'yes'")),
        ("  box_size: big", ("key 'box_size'", "expected list of number, got 'big'")),
        ("  global_batch_size: '64'", ("key 'global_batch_size'", "expected integer, got '64'")),
        ("  1: 2", ("unknown key '1'",)),
    ],
)
def test_a_tutorial_yaml_with_a_wrong_type_is_one_error_line(tmp_path, line, texts):
    """A tutorial-format file whose key holds the wrong type (``weight_init: normal``, a list where the
    tutorial has a mapping): the trainer's one line names the key, the value and the expected type."""
    key = line.split(":")[0]
    path = tmp_path / "UNet.yaml"
    kept = [old for old in TUTORIAL_YAML.splitlines() if not old.startswith(key + ":")]
    path.write_text("\n".join(kept).replace("  lambda_rho: 0", "  lambda_rho: 0\n" + line, 1))
    # what `python -m jax_impl.train` (and tf_impl.train) answers before the framework loads
    res = run_in_process(
        lambda argv: check_arguments("train_jax", argv), ["--yaml_config", str(path), "--config", "short"]
    )
    assert_one_error_line(res, str(path), "[short]", *texts)


def test_numbers_as_people_write_them():
    """YAML 1.1 reads 1e-3 as a string; the config takes it as the number it is."""
    assert config_mod.load_config("cpu_tiny", overrides={"start_lr": "1e-3"}).start_lr == 1e-3
    assert config_cli.parse_override("start_lr=1e-3") == ("start_lr", "1e-3")
    with pytest.raises(ConfigError, match=r"key 'start_lr': expected number, got 'fast'"):
        config_mod.load_config("cpu_tiny", overrides={"start_lr": "fast"})


def test_every_numeric_key_has_a_range():
    numeric = [
        k
        for k, tp in config_schema.FIELD_TYPES.items()
        if k in config_schema.FIELDS and ("int" in str(tp) or "float" in str(tp))
    ]
    checked_elsewhere = {"density_channel", "nbody_vector_channels", "hydro_vector_channels", "profile_steps"}
    assert set(numeric) - checked_elsewhere <= set(config_checks.RANGES), (
        set(numeric) - checked_elsewhere - set(config_checks.RANGES)
    )
    for key, (minimum, inclusive) in config_checks.RANGES.items():
        bad = minimum - 1 if inclusive else minimum
        value = [bad] if key == "unet_widths" else bad
        with pytest.raises(ConfigError, match=rf"key '{key}': expected"):
            config_mod.replace(config_mod.load_config("cpu_tiny"), **{key: value})


def test_an_overridden_path_finds_its_npy_twins_beside_it(tmp_path):
    """The tutorial's ``*_npy_*`` keys belong to its own paths: a ``train_path`` given on the command
    line looks for its twins beside it (one note says so) instead of at ``/data``."""
    path = tmp_path / "UNet.yaml"
    path.write_text(TUTORIAL_YAML)
    cfg = config_mod.load_config("short_opt", path, {"train_path": str(tmp_path / "train_128.h5")})
    assert cfg.npy_files("train") == (tmp_path / "train_128_Nbody.npy", tmp_path / "train_128_Hydro.npy")
    assert cfg.npy_files("val") == (
        Path("/data/downsamp_1024crop_valid_data.npy"),
        Path("/data/downsamp_1024crop_valid_label.npy"),
    )
    assert any(n.startswith("train_path overridden: its .npy twins are looked up beside it") for n in cfg.notes)
    both = {"train_path": "t.h5", "train_path_npy_data": "d.npy", "train_path_npy_label": "l.npy"}
    assert [p.name for p in config_mod.load_config("short_opt", path, both).npy_files("train")] == ["d.npy", "l.npy"]
