from __future__ import annotations

import argparse
import dataclasses

import pytest

from shared_data import config as C
from shared_data.errors import ConfigError


def test_every_named_config_loads_and_is_frozen():
    names = C.config_names()
    for required in (
        "base",
        "short",
        "short_opt",
        "bs64_opt",
        "bs256_opt",
        "bs512_opt",
        "bs2048_opt",
        "cpu_default",
        "cpu_tiny",
    ):
        assert required in names
    for name in names:
        cfg = C.load_config(name)
        assert cfg.name == name
    cfg = C.load_config("short")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_epochs = 3  # type: ignore[misc]


def test_overlays_inherit_from_base():
    base, short, opt = C.load_config("base"), C.load_config("short"), C.load_config("short_opt")
    assert short.num_epochs == 4 and short.Nsamples == 512
    assert short.unet_widths == base.unet_widths == (64, 128, 256, 512, 512, 512)
    assert opt.enable_amp and opt.precision == "bfloat16" and opt.Nsamples == 512
    assert base.precision == "float32"
    assert C.load_config("bs256_opt").global_batch_size == 256


def _write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def _base_with(tmp_path, extra):
    src = C.DEFAULT_YAML.read_text()
    return _write(tmp_path, src + "\nbad:\n  <<: *base\n" + extra)


def test_unknown_key_names_file_section_and_key(tmp_path):
    p = _base_with(tmp_path, "  num_epoch: 3\n")
    with pytest.raises(ConfigError, match=r"c\.yaml \[bad\]: unknown key 'num_epoch'"):
        C.load_config("bad", p)


def test_wrong_type_names_key_and_expected_type(tmp_path):
    p = _base_with(tmp_path, "  num_epochs: three\n")
    with pytest.raises(ConfigError, match=r"\[bad\] key 'num_epochs': expected integer, got 'three'"):
        C.load_config("bad", p)
    p = _base_with(tmp_path, "  enable_amp: 1\n")
    with pytest.raises(ConfigError, match=r"key 'enable_amp': expected boolean"):
        C.load_config("bad", p)
    p = _base_with(tmp_path, "  unet_widths: 64\n")
    with pytest.raises(ConfigError, match=r"key 'unet_widths': expected list of integer"):
        C.load_config("bad", p)


def test_bad_choice_missing_key_missing_name_missing_file(tmp_path):
    p = _base_with(tmp_path, "  data_loader_config: fast\n")
    with pytest.raises(ConfigError, match=r"'data_loader_config': expected one of synthetic, inmem"):
        C.load_config("bad", p)
    p = _write(tmp_path, "only:\n  num_epochs: 1\n")
    with pytest.raises(ConfigError, match=r"\[only\]: missing key 'train_path'"):
        C.load_config("only", p)
    with pytest.raises(ConfigError, match=r"config 'nope' not found in .*UNet\.yaml \(available: .*short"):
        C.load_config("nope")
    with pytest.raises(ConfigError, match=r"config file .*missing\.yaml not found"):
        C.load_config("base", tmp_path / "missing.yaml")


def test_crop_must_divide_by_levels():
    with pytest.raises(ConfigError, match=r"'crop_size': 48 must be divisible by 2\*\*6"):
        C.load_config("base", overrides={"crop_size": 48})
    assert C.load_config("base", overrides={"crop_size": 32, "full_scale": False}).crop_size == 32


@pytest.mark.parametrize("key", ["num_epochs", "upconv_transpose_below", "downconv_strided_below"])
def test_counts_must_not_be_negative(key):
    with pytest.raises(ConfigError, match=rf"key '{key}': expected an integer >= 0, got -1"):
        C.replace(C.load_config("cpu_tiny"), **{key: -1})


def test_cli_flags_and_set_overrides():
    parser = argparse.ArgumentParser()
    C.add_config_args(parser)
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
    cfg = C.config_from_args(args)
    assert (cfg.num_epochs, cfg.enable_amp, cfg.data_loader_config) == (2, True, "lowmem")
    assert cfg.unet_widths == (8, 16) and cfg.full_scale is False and cfg.lambda_rho == 0.5
    with pytest.raises(ConfigError, match=r"override 'nope=1': unknown key 'nope'"):
        C.parse_override("nope=1")
    with pytest.raises(ConfigError, match=r"expected KEY=VALUE"):
        C.parse_override("num_epochs")
    args = parser.parse_args(["--config", "short", "--set", "num_epochs=2.5"])
    with pytest.raises(ConfigError, match=r"key 'num_epochs': expected integer, got 2\.5"):
        C.config_from_args(args)


def test_batch_sizes_and_steps():
    cfg = C.load_config("base")
    assert C.batch_sizes(cfg, 1) == (64, 64)
    assert C.batch_sizes(cfg, 4) == (64, 16)
    with pytest.raises(ConfigError, match=r"global_batch_size 64 does not divide over 3 replicas"):
        C.batch_sizes(cfg, 3)
    local = C.replace(cfg, local_batch_size=16)
    assert C.batch_sizes(local, 3) == (48, 16)
    assert C.steps_per_epoch(cfg) == 2048 // 64
    assert C.val_steps(C.replace(cfg, Nsamples_val=65)) == 2
    with pytest.raises(ConfigError, match=r"Nsamples 32 is smaller than one global batch \(64\)"):
        C.steps_per_epoch(C.replace(cfg, Nsamples=32))
