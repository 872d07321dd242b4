"""Every command in the README's ``bash`` blocks runs as written, in README order, on CPU with tiny
settings (a tiny copy of the kit's YAML, tiny data, few timed steps), in a scratch folder; a command
that needs a GPU or SLURM ends with one ``error:`` line instead. A command added to the README with no
way to run here fails :func:`test_every_readme_command_is_covered`."""

from __future__ import annotations

import importlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shared_data.core import commands, config_cli
from shared_data.core import config as config_mod
from shared_data.core.errors import run_cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: What makes each kit config tiny (the net of cpu_tiny, a few crops, one epoch).
TINY = dict(
    crop_size=16,
    unet_widths=[4, 8, 8],
    full_scale=True,
    Nsamples=8,
    Nsamples_val=4,
    num_epochs=1,
    global_batch_size=4,
    local_batch_size=None,
    base_batch_size=4,
    num_data_workers=1,
    synthetic_volume_size=32,
    train_path_npy_data=None,
    train_path_npy_label=None,
    val_path_npy_data=None,
    val_path_npy_label=None,
)
#: Few timed steps for the commands that measure.
FEW_STEPS = {
    "dlas_compare.benchmark": ["--warmup", "0", "--steps", "1", "--windows", "1"],
    "dlas_compare.compare": ["--warmup", "0", "--steps", "1", "--windows", "1"],
    "dlas_compare.ladder": ["--warmup", "0", "--steps", "1", "--windows", "1", "--budget_sec", "8"],
    "dlas_compare.step_breakdown": ["--warmup", "1", "--steps", "1"],
}
#: How the ladder reports a rung stopped at its time budget.
BUDGET_STOP = "stopped at the ladder's time budget"
#: Commands that cannot run on this machine, each with the line it must end with (exit code 2).
REFUSES_ON_CPU = {
    "scripts/gpu/scaling.sh": "error: .*needs an NVIDIA GPU",
    "scripts/launch/submit_slurm.sh": "error: .*SLURM",
    "--framework torch": "error: .*torch",
}
#: Appended to a ``python -c`` snippet: it ran without importing any of the kit's packages (an editable
#: install of the kit would make them importable from anywhere).
WITHOUT_THE_KIT = """
import sys
kit = {m.split(".")[0] for m in sys.modules} & {"shared_data", "jax_impl", "tf_impl", "dlas_compare"}
assert not kit, f"the snippet imported the kit's {sorted(kit)}"
"""
#: Commands a test cannot repeat, and why.
NOT_RUN = {"bash scripts/test.sh": "the test suite itself"}
#: Parts of the commands that install packages (the test runs in the installed kit; tests/test_packaging.py
#: installs the wheel and trains from another folder).
INSTALLS = ("pip install", "-m venv", "-env/bin/")


def not_run(command: str) -> str | None:
    """Why ``command`` is not run here, or None."""
    if any(part in command for part in INSTALLS):
        return "installs packages (tests/test_packaging.py installs the wheel and runs it)"
    if "JAX_NUM_PROCESSES=" in command or command.startswith("NPROC="):
        return "one process of a multi-process run (tests/test_distributed.py starts two processes)"
    return NOT_RUN.get(command)


def console_module(words: list[str]) -> str | None:
    """The module of a console script (``dlas-doctor`` -> ``dlas_compare.doctor``), or None."""
    scripts = {script: module for module, script in commands.SCRIPTS.items()}
    return scripts.get(words[0]) if words else None


def readme_commands(text: str) -> list[str]:
    """The commands of ``text``'s ```bash blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(shlex.join(words))
    return commands


COMMANDS = readme_commands(README.read_text())


def test_readme_commands_are_extracted():
    assert COMMANDS[0] == "bash scripts/main.sh"
    assert "python -m shared_data.data.generate --out data/train_128.h5 --size 128 --seed 1 --npy" in COMMANDS
    joined = [c for c in COMMANDS if c.startswith("nsys profile")]
    assert joined and joined[0].endswith(
        "-m jax_impl.train --config short_opt --enable_manual_profiling --run_num profile"
    )
    assert not any("#" in c or "\\" in c for c in COMMANDS)


#: The README and the pages under docs/ it links: where links, figures and study names are checked.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_studies_and_figures_resolve():
    """Every relative link and image of the README and docs/*.md names a file of the checkout (with
    ``#anchor``, a heading of that file); every study the README names (`experiments/<name>`) exists;
    docs/figures/ holds only figures these pages show."""
    shown = set()
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path, _, fragment = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}: the link {target} names no file"
            shown.add(file)
            if fragment:
                headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
                assert fragment in headings, f"{page.name}: {target}: no such heading in {file.name}"
    for study in set(re.findall(r"`experiments/([\w.-]+)", README.read_text())):
        assert (ROOT / "experiments" / study).exists(), f"README.md names experiments/{study}, which does not exist"
    figures = set((ROOT / "docs/figures").iterdir())
    assert figures and figures <= shown, f"docs/figures/ holds figures no page shows: {sorted(figures - shown)}"


def refusal(command: str) -> str | None:
    return next((line for key, line in REFUSES_ON_CPU.items() if key in command), None)


def test_every_readme_command_is_covered():
    """Each command is a python module, a script this test runs, a GPU/SLURM command that must refuse, or
    listed in NOT_RUN with the reason."""
    for command in COMMANDS:
        words = shlex.split(command)
        runnable = "python" in words or words[:2] == ["bash", "scripts/main.sh"] or "single_host.sh" in command
        runnable = runnable or console_module(words) is not None
        assert runnable or refusal(command) or not_run(command), f"the README test cannot run: {command}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, data_dir):
    """A scratch folder the commands run in: a tiny copy of the kit's YAML (``tiny.yaml``), a tiny
    tutorial-format YAML where the README expects the tutorial's file and the 24^3 validation volume
    at ``data/val_64.h5`` (its tiny twin)."""
    ws = tmp_path_factory.mktemp("readme")
    (ws / "git_status_before").write_text(git_status())
    (ws / "data").mkdir()
    for suffix in (".h5", "_Nbody.npy", "_Hydro.npy"):
        shutil.copy(data_dir / f"val_24{suffix}", ws / "data" / f"val_64{suffix}")
    doc = yaml.safe_load(config_mod.DEFAULT_YAML.read_text())
    tiny = {
        name: {
            **section,
            **TINY,
            "train_path": str(ws / "data/train_128.h5"),
            "val_path": str(ws / "data/val_64.h5"),
            "exp_dir": str(ws / "runs"),
            "xla_cache_dir": str(ws / "xla_cache"),
        }
        for name, section in doc.items()
    }
    (ws / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    tutorial = ws / "sc21-dl-tutorial/config/UNet.yaml"
    tutorial.parent.mkdir(parents=True)
    # the tutorial's keys, its .npy keys pointing at /data; --set overrides the paths
    tutorial.write_text(
        "base: &base\n  lr_schedule: {scaling: 'sqrt', start_lr: 2.E-4, end_lr: 0., warmup_steps: 0}\n"
        "  data_loader_config: 'lowmem'\n  data_size: 16\n  num_data_workers: 1\n  global_batch_size: 4\n"
        "  base_batch_size: 4\n  Nsamples: 8\n  Nsamples_val: 4\n  num_epochs: 1\n  expdir: 'runs'\n"
        "  train_path: '/data/downsamp_2048crop_train.h5'\n  val_path: '/data/downsamp_1024crop_valid.h5'\n"
        "  train_path_npy_data: '/data/downsamp_2048crop_train_data.npy'\n"
        "  train_path_npy_label: '/data/downsamp_2048crop_train_label.npy'\n"
        "short:\n  <<: *base\n"
    )
    return ws


def git_status() -> str:
    """The checkout's ``git status --porcelain`` (what is modified or untracked and not ignored)."""
    return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout


def tiny_argv(module: str, args: list[str], ws: Path) -> list[str]:
    """``args`` of ``python -m module`` with tiny settings: the tiny YAML (or, where the command names
    its own YAML, tiny overrides), smaller generated volumes, few timed steps."""
    tiny = {"--size": "32", "--Nsamples": str(TINY["Nsamples"])}  # smaller volumes, fewer crops an epoch
    args = [tiny.get(prev, a) for prev, a in zip(["", *args], args)]
    if "--config" in args or module in ("dlas_compare.plots", "dlas_compare.summary"):
        if "--yaml_config" in args:
            sets = {"unet_widths": "[4,8,8]", "train_path": ws / "data/train_128.h5", "val_path": ws / "data/val_64.h5"}
            args += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        else:
            args = ["--yaml_config", str(ws / "tiny.yaml"), *args]
    if "--global_batch_size" in args:  # an epoch of the tiny crops holds at least the command's batch
        batch = args[args.index("--global_batch_size") + 1]
        args += ["--set", f"Nsamples={batch}", "--set", f"Nsamples_val={batch}"]
    return args + FEW_STEPS.get(module, [])


def python_module(words: list[str]) -> tuple[str, list[str]] | None:
    """``(module, args)`` of a command that runs ``python -m module args`` (also behind ``nsys profile``)."""
    if "python" in words and words[words.index("python") + 1] == "-m":
        i = words.index("python")
        return words[i + 2], words[i + 3 :]
    return None


def run_in_process(module: str, argv: list[str], capsys) -> tuple[int, str]:
    """``python -m module argv`` in this process; the log handlers it adds go with it (their streams are
    this test's captured ones)."""
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        code = run_cli(importlib.import_module(module).main, argv)
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
    out = capsys.readouterr()
    return code, out.out + out.err


def run_script(command: list[str], ws: Path, env_extra: dict | None = None) -> tuple[int, str]:
    """A shell script of the checkout, from ``ws``, with this interpreter as ``python``/``python3``
    and no ``nvidia-smi``/``srun``/``sbatch`` on the PATH."""
    bin_dir = ws / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(sys.executable)
    path = f"{bin_dir}:/usr/bin:/bin"
    env = {**os.environ, "PATH": path, "PY": sys.executable, "OUT": str(ws / "out"), "PYTHONPATH": str(ROOT)}
    env.update(env_extra or {})
    (ws / "out").mkdir(exist_ok=True)
    command = [str(ROOT / c) if c.endswith(".sh") else c for c in command]
    cwd = ROOT if refusal(shlex.join(command)) else ws  # the GPU recipes run from the checkout's root
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def main_sh_commands() -> list[list[str]]:
    """The python commands of ``scripts/main.sh`` (after its set-up step), as a re-run gives them."""
    commands = []
    for line in (ROOT / "scripts/main.sh").read_text().splitlines():
        if line.startswith("$PY -m "):
            commands.append(shlex.split(line.replace("$PY ", "python ").replace("$mode", "--resume")))
    return commands


def outputs(args: list[str]) -> list[str]:
    """The files a command names after ``--out``, ``--figure`` and ``--save_weights``."""
    return [b for a, b in zip(args, args[1:]) if a in ("--out", "--figure", "--save_weights")]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command(command, workspace, capsys, monkeypatch):
    ws = workspace
    monkeypatch.chdir(ws)
    if not_run(command):
        pytest.skip(not_run(command))
    words = shlex.split(command)
    env_extra = {}
    while words and re.match(r"[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value before the command
        key, _, value = words.pop(0).partition("=")
        env_extra[key] = value
    expected_refusal = refusal(command)
    if expected_refusal and words[0] != "python":
        script = next(i for i, w in enumerate(words) if w.endswith(".sh"))
        code, output = run_script(["bash", *words[script:]], ws)  # sbatch is not here: its script, run as is
        assert code == 2, output
        assert re.search(expected_refusal, output.strip().splitlines()[-1]), output
        assert "Traceback" not in output
        return
    if words[:2] == ["python", "-c"]:  # a snippet that loads an export in plain Python: its own interpreter
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
        code = words[2] + WITHOUT_THE_KIT
        proc = subprocess.run([sys.executable, "-c", code], cwd=ws, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().endswith(", 5)"), proc.stdout  # the output's shape: 5 gas channels last
        return
    if words[:2] == ["bash", "scripts/main.sh"]:
        steps = main_sh_commands()
        assert [s[2] for s in steps] == [
            "shared_data.data.generate",
            "shared_data.data.generate",
            "tf_impl.train",
            "jax_impl.train",
            "dlas_compare.plots",
            "dlas_compare.summary",
        ]
    elif "single_host.sh" in command:
        code, output = run_script([*words, "--yaml_config", str(ws / "tiny.yaml")], ws, env_extra)
        assert code == 0 and "Traceback" not in output, output
        assert "Avg train loss" in output
        return
    elif console_module(words):
        steps = [["python", "-m", console_module(words), *words[1:]]]
    else:
        steps = [words]
    for step in steps:
        module, args = python_module(step)
        argv = tiny_argv(module, args, ws)
        code, output = run_in_process(module, argv, capsys)
        if expected_refusal:
            assert code == 2 and re.search(expected_refusal, output), output
            continue
        failures = [line for line in output.splitlines() if "failed" in line]
        if module == "dlas_compare.ladder" and code == 1 and all(BUDGET_STOP in line for line in failures):
            code = 0  # on a busy CI machine the rungs past the test's budget stop there
        assert code == 0, f"{shlex.join(step)} -> exit {code}:\n{output}"
        assert "Traceback" not in output
        for path in outputs(args):
            assert (ws / path).exists(), f"{shlex.join(step)} did not write {path}"


#: The commands whose CPU counterpart :func:`test_a_cpu_counterpart_keeps_the_lesson` checks, with the
#: parser each one's config comes from.
PARSERS = {
    "jax_impl.train": lambda: importlib.import_module("shared_data.runtime.cli").build_parser("jax"),
    "tf_impl.train": lambda: importlib.import_module("shared_data.runtime.cli").build_parser("tf"),
    "dlas_compare.benchmark": lambda: importlib.import_module("dlas_compare.benchmark").build_parser(),
}


def cpu_counterparts(text: str) -> list[tuple[list[str], list[str], str]]:
    """``(command words, counterpart flags, comment)`` of each ```bash line whose comment gives a CPU
    counterpart as flags (``# GPU, bf16; CPU: --config cpu_default --enable_amp``)."""
    pairs = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command, _, comment = line.partition("#")
            counterpart = re.search(r"CPU: (--[^;]*)", comment)
            if counterpart:
                pairs.append((shlex.split(command), shlex.split(counterpart[1]), comment))
    return pairs


def test_a_cpu_counterpart_keeps_the_lesson():
    """A GPU command's CPU counterpart (its flags after the command's) runs a CPU config with the
    same loader and, where the comment names the precision, the same precision: the bf16 lesson's
    counterpart computes in bf16, not in cpu_default's float32."""
    checked = 0
    for words, flags, comment in cpu_counterparts(README.read_text()):
        module, args = python_module(words) or (None, [])
        if module not in PARSERS:
            continue
        at = args.index("--config")
        kept = args[:at] + args[at + 2 :]  # the counterpart's --config, and its other flags after the command's
        parsed = PARSERS[module]().parse_args(args)
        gpu, cpu = (
            config_cli.config_from_args(parsed),
            config_cli.config_from_args(PARSERS[module]().parse_args(kept + flags)),
        )
        assert cpu.name in ("cpu_default", "cpu_tiny") and gpu.name not in ("cpu_default", "cpu_tiny"), words
        if getattr(parsed, "mode", None) != ["synthetic"]:  # SYNTHETIC reads no input
            assert cpu.data_loader_config == gpu.data_loader_config, words
        if "bf16" in comment or "fp32" in comment:
            assert cpu.enable_amp == gpu.enable_amp == ("bf16" in comment), words
        checked += 1
    assert checked >= 5


def test_the_tutorial_clone_the_readme_asks_for_stays_out_of_git_status():
    """The README clones the tutorial inside the checkout (``sc21-dl-tutorial/``): git ignores it."""
    assert "git clone` it inside this checkout" in README.read_text()
    proc = subprocess.run(
        ["git", "check-ignore", "--no-index", "sc21-dl-tutorial/config/UNet.yaml"], cwd=ROOT, capture_output=True
    )
    assert proc.returncode == 0


#: What the test itself puts in the scratch folder (not written by a README command).
SCAFFOLD = ("tiny.yaml", "sc21-dl-tutorial/", "bin/", "out/", "xla_cache/", "data/val_64", "git_status")


@pytest.mark.slow
def test_readme_outputs_leave_the_checkout_clean(workspace):
    """Everything the README's commands wrote (in the scratch folder, as they would in the checkout) is
    ignored by the checkout's .gitignore, so ``git status`` stays clean."""
    names = (str(p.relative_to(workspace)) + ("/" if p.is_dir() else "") for p in workspace.rglob("*"))
    written = sorted(name for name in names if not name.startswith(SCAFFOLD))
    assert "results/ladder_cpu.png" in written and "pred.h5" in written and "val_report/" in written
    proc = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin", "-v", "-n"],
        input="\n".join(written),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    not_ignored = [line.split("\t")[-1] for line in proc.stdout.splitlines() if line.startswith("::")]
    assert not_ignored == []
    assert git_status() == (workspace / "git_status_before").read_text()  # and nothing in the checkout changed
