"""The kit as a package: a wheel installed into a fresh folder trains from any folder with its console
scripts and its doctor reports every check; a missing framework is one error line, also for --help."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shared_data.core.config import REPO_ROOT


def _run(cmd, cwd, env=None, timeout=600):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_wheel_installs_and_trains_from_another_folder(tmp_path):
    wheels, target, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    build = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(REPO_ROOT),
        ],
        cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("dlas_cosmo-*.whl")
    inst = _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], cwd=tmp_path
    )
    assert inst.returncode == 0, inst.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target), "TF_CPP_MIN_LOG_LEVEL": "2"}
    where = _run(
        [
            sys.executable,
            "-c",
            "import jax_impl, shared_data.core.config as c; print(jax_impl.__file__); print(c.DEFAULT_YAML)",
        ],
        cwd=work,
        env=env,
    )
    assert where.stdout.split() == [
        str(target / "jax_impl" / "__init__.py"),
        str(target / "shared_data" / "configs" / "UNet.yaml"),
    ]
    top_level = {p.name for p in target.iterdir() if p.is_dir() and not p.name.endswith((".dist-info", "bin"))}
    assert top_level == {"shared_data", "tf_impl", "jax_impl", "dlas_compare"}  # no "configs", no "compare"
    bin_ = target / "bin"
    for out, size, seed in (("data/train_128.h5", 32, 1), ("data/val_64.h5", 24, 2)):
        gen = _run(
            [str(bin_ / "dlas-generate"), "--out", out, "--size", str(size), "--seed", str(seed)], cwd=work, env=env
        )
        assert gen.returncode == 0, gen.stderr[-2000:]
    train = _run(
        [str(bin_ / "dlas-train-jax"), "--config", "cpu_tiny", "--set", f"xla_cache_dir={tmp_path / 'c'}"],
        cwd=work,
        env=env,
    )
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-2000:]
    assert "Time taken for epoch 1 is" in train.stdout
    folder = work / "runs" / "cpu_tiny" / "jax"  # the run folder under the current folder
    assert (folder / "metrics.jsonl").is_file() and (folder / "out.log").is_file()
    assert f"data: {work / 'data' / 'train_128.h5'}" in train.stdout
    info = _run([str(bin_ / "dlas-inspect"), "data/val_64.h5"], cwd=work, env=env)
    assert info.returncode == 0 and "contract: OK" in info.stdout
    help_tf = _run([str(bin_ / "dlas-train-tf"), "--help"], cwd=work, env=env)
    assert help_tf.returncode == 0 and "--enable_jit" in help_tf.stdout
    # the pins travel with the wheel: pip finds them through the doctor, and the doctor checks them
    from dlas_compare.doctor import compare_pins

    for kind in ("cpu", "cuda"):
        where = _run([str(bin_ / "dlas-doctor"), "--constraints", kind], cwd=work, env=env)
        shipped = target / "shared_data" / "pins" / f"constraints-{kind}.txt"
        assert where.returncode == 0 and where.stdout.strip() == str(shipped), where.stdout + where.stderr
        assert shipped.read_text() == (REPO_ROOT / "requirements" / shipped.name).read_text()
    # the doctor reports each check with a verdict (one run of it: its probes import every framework)
    doctor = _run([str(bin_ / "dlas-doctor"), "--json", str(tmp_path / "d.json")], cwd=work, env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    import json

    rows = {r["check"]: r for r in json.loads((tmp_path / "d.json").read_text())}
    pins = target / "shared_data" / "pins" / "constraints-cpu.txt"
    differ = [d for d in compare_pins(pins) if d[2] != "not installed"]  # this process's environment is the wheel's
    assert rows["pinned versions"]["verdict"] == ("WARN" if differ else "OK")
    assert str(pins) in rows["pinned versions"]["detail"]
    assert rows["python"]["verdict"] == "OK" and rows["jax"]["verdict"] == "OK"
    assert rows["jax"]["detail"].startswith("0.") and "cpu" in rows["jax"]["detail"]
    assert rows["tensorflow"]["verdict"] == "OK" and rows["DALI"]["verdict"] == "OK"
    assert "--xla_gpu_force_conv_nhwc=true" in rows["XLA_FLAGS in force"]["detail"]
    assert "--xla_gpu_experimental_enable_fusion_autotuner=false" in rows["XLA_FLAGS in force"]["detail"]
    assert set(rows) >= {"GPUs (nvidia-smi)", "torch", "DALI TensorFlow plugin", "pinned versions"}
    for line in doctor.stdout.splitlines():
        assert line.split()[-1] and any(v in line for v in ("OK", "WARN", "FAIL", "SKIP"))


BLOCK_TF = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
"""


@pytest.mark.slow
def test_a_missing_framework_is_one_error_line(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_TF)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO_ROOT}"}
    for cmd in (
        [sys.executable, "-m", "tf_impl.train", "--config", "cpu_tiny"],
        [
            sys.executable,
            "-c",
            "import sys; from shared_data.console import train_tf; "
            "sys.argv = ['dlas-train-tf', '--config', 'cpu_tiny']; sys.exit(train_tf())",
        ],
    ):
        res = _run(cmd, cwd=tmp_path, env=env)
        assert res.returncode == 2, res.stderr
        assert (
            res.stderr.strip()
            == "error: tf_impl needs tensorflow, which is not installed: pip install 'dlas-cosmo[tf]'"
        )
    # --help is answered from the shared parser, before TensorFlow is needed: by python -m and the console script
    module_help = _run([sys.executable, "-m", "tf_impl.train", "--help"], cwd=tmp_path, env=env)
    assert module_help.returncode == 0 and "usage: python -m tf_impl.train" in module_help.stdout, module_help.stderr
    script_help = _run(
        [
            sys.executable,
            "-c",
            "import sys; from shared_data.console import train_tf; "
            "sys.argv = ['dlas-train-tf', '--help']; sys.exit(train_tf())",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert script_help.returncode == 0 and script_help.stdout.startswith("usage: dlas-train-tf")
    jax_help = _run([sys.executable, "-m", "jax_impl.train", "--help"], cwd=tmp_path, env=env)
    assert jax_help.returncode == 0 and "--run_num" in jax_help.stdout


def test_doctor_compares_installed_versions_with_the_pins(tmp_path):
    from importlib import metadata

    from dlas_compare.doctor import compare_pins

    pins = tmp_path / "c.txt"
    pins.write_text(f"# comment\nnumpy=={metadata.version('numpy')}\nh5py==0.0.1\nno-such-package==1.0\n")
    assert compare_pins(pins) == [
        ("h5py", "0.0.1", metadata.version("h5py")),
        ("no-such-package", "1.0", "not installed"),
    ]


def test_the_doctor_warns_of_versions_that_differ_not_of_extras_left_out(monkeypatch, capsys):
    """The doctor says what it does before its seconds of probes. A pinned package that is not
    installed (pytest, ruff, hypothesis without the ``test`` extra) is listed, not warned of; an
    installed version that differs from its pin is."""
    from pathlib import Path

    from dlas_compare import doctor
    from dlas_compare.doctor import pins_verdict

    monkeypatch.setattr(doctor, "checks", lambda: print("probed", file=sys.stderr) or [("python", "OK", "3.12")])
    assert doctor.main([]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[doctor] checking: ") and err[1] == "probed"

    pins = Path("c.txt")
    absent = [("ruff", "0.17.6", "not installed"), ("pytest", "9.2.0", "not installed")]
    assert pins_verdict([], pins) == ("OK", "installed versions match c.txt")
    assert pins_verdict(absent, pins) == (
        "OK",
        "installed versions match c.txt; not installed (extras left out): pytest, ruff",
    )
    assert pins_verdict([("jax", "0.11.2", "0.12.0.1"), *absent], pins) == (
        "WARN",
        "jax 0.12.0.1 (pinned 0.11.2) (c.txt); not installed (extras left out): pytest, ruff",
    )


def test_every_console_script_names_a_command_with_a_main():
    import importlib
    import tomllib

    from shared_data import console

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {
        "dlas-train-jax",
        "dlas-train-tf",
        "dlas-predict-jax",
        "dlas-validate",
        "dlas-ladder",
        "dlas-doctor",
    } <= set(scripts)
    for script, target in scripts.items():
        module, name = target.split(":")
        assert module == "shared_data.console" and callable(getattr(console, name)), script
        assert callable(importlib.import_module(console.COMMANDS[name][0]).main), script


def test_pyproject_lists_every_package_folder():
    import tomllib

    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO_ROOT).parts)
        for top in ("shared_data", "tf_impl", "jax_impl", "dlas_compare")
        for init in (REPO_ROOT / top).rglob("__init__.py")
    }
    assert listed == found | {"shared_data.configs", "shared_data.pins"}


def test_the_repository_keeps_no_generated_compiler_dumps():
    """Compiler dumps (StableHLO/MLIR, HLO, PTX, LLVM IR) are regenerated by the study that needs them,
    never committed: they would be most of the lines a reader sees."""
    res = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"not a git checkout: {res.stderr.strip()}")
    dumps = [f for f in res.stdout.splitlines() if f.endswith((".mlir", ".hlo", ".ptx", ".ll")) or "xla_dump" in f]
    assert dumps == []
