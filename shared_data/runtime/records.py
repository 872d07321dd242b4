"""What a run records in its folder besides checkpoints: TensorBoard scalars under the tutorial's tags and
the config as hparams,
``metrics.jsonl`` (one record per epoch), ``run.json`` (the invocations) and the code version.

Files are written atomically (:mod:`shared_data.core.files`); records of a resumed or multi-process run
are appended, never replaced, and readers skip a torn line with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from shared_data.core import config as config_mod
from shared_data.core.commands import package_version
from shared_data.core.files import write_atomic
from shared_data.runtime import launch

log = logging.getLogger("dlas")


#: The scalar tags of a run: the tutorial's three, and the step rate.
TENSORBOARD_TAGS = ("Loss/train", "Loss/valid", "Learning Rate", "Avg iters per sec")


def hparam_value(value: object) -> bool | int | float | str:
    """A config value as TensorBoard's hparams plugin takes it: numbers, booleans and strings as they
    are, anything else (lists, None) as its text."""
    return value if isinstance(value, bool | int | float | str) else json.dumps(value)


class ScalarWriter:
    """TensorBoard scalars and hparams through tensorboardX (a public API that imports no TensorFlow,
    so a JAX run stays free of it); a warning and no-op when tensorboardX is missing, a no-op when
    disabled."""

    def __init__(self, logdir: Path, enabled: bool):
        self._writer = None
        if not enabled:
            return
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            log.warning("tensorboardX is not installed: no TensorBoard records (pip install tensorboardX)")
            return
        self._writer = SummaryWriter(str(logdir), flush_secs=30)

    def scalars(self, step: int, values: dict) -> None:
        """Write ``values`` (tag -> number) at global step ``step``, under the tags as given
        (``add_scalar`` would rename the tutorial's ``Learning Rate`` to ``Learning_Rate``)."""
        if self._writer is not None:
            from tensorboardX.proto.summary_pb2 import Summary

            summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items()])
            self._writer._get_file_writer().add_summary(summary, step)
            self._writer.flush()

    def close(self) -> None:
        """Write what is queued and close the event file (tensorboardX writes from a queue, which
        ``flush`` does not drain)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def hparams(self, values: dict, metrics: Sequence[str]) -> None:
        """Write ``values`` (name -> config value) as the run's hparams, with ``metrics`` (scalar tags)
        as the columns TensorBoard's HPARAMS tab shows beside them; in the run's own folder, so the
        scalars and the hparams are one run there."""
        if self._writer is None:
            return
        from tensorboardX.summary import hparams

        experiment, start, end = hparams({k: hparam_value(v) for k, v in values.items()}, dict.fromkeys(metrics, 0.0))
        writer = self._writer._get_file_writer()
        for summary in (experiment, start, end):
            writer.add_summary(summary)
        self._writer.flush()


class MetricsLog:
    """``<workdir>/metrics.jsonl``: one JSON object per epoch, appended; on resume the records after
    the restored epoch are dropped by an atomic rewrite. Does nothing when ``enabled`` is False."""

    def __init__(self, workdir: Path, enabled: bool = True):
        self.path, self.enabled = workdir / "metrics.jsonl", enabled

    def append(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    def amend(self, epoch: int, fields: dict) -> None:
        """Add ``fields`` to the record of ``epoch`` (epochs done; an atomic rewrite of the file); nothing
        when no record has that epoch."""
        if self.enabled and self.path.exists():
            records = read_metrics(self.path.parent)
            for record in records:
                if record["epoch"] == epoch:
                    record.update(fields)
                    write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in records))
                    return

    def truncate_after(self, epoch: int) -> None:
        """Keep the records of epochs <= ``epoch`` (and drop a torn last line)."""
        if self.enabled and self.path.exists():
            keep = [r for r in read_metrics(self.path.parent) if r["epoch"] <= epoch]
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in keep))


def read_metrics(workdir: str | Path) -> list[dict]:
    """The epoch records of ``<workdir>/metrics.jsonl`` (empty if none). A line that is not a JSON
    object with an ``epoch`` (a torn write) is skipped with a warning naming the file and line."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("epoch"), int):
            log.warning("%s line %d is not an epoch record (a torn write?): skipped", path, i)
            continue
        records.append(record)
    return records


def run_info_and_problem(workdir: Path) -> tuple[dict, str | None]:
    """``<workdir>/run.json`` as a dict and, when it cannot be used, what is wrong with it (``is not
    valid JSON (...)``, ``is not text``, ``cannot be read (...)``, ``holds a JSON list, not an object``);
    ``({}, None)`` when there is none."""
    path = workdir / "run.json"
    if not path.exists():
        return {}, None
    try:
        info = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        return {}, "is not text (a binary or damaged file)"
    except json.JSONDecodeError as err:
        return {}, f"is not valid JSON ({err.msg}: line {err.lineno} column {err.colno})"
    except OSError as err:
        return {}, f"cannot be read ({err.strerror})"
    if not isinstance(info, dict):
        return {}, f"holds a JSON {type(info).__name__}, not an object"
    if not isinstance(info.get("invocations", []), list):
        return {}, "holds invocations that are not a list"
    return info, None


def read_run_info(workdir: Path) -> dict:
    """``<workdir>/run.json`` as a dict; empty when missing, and empty with a warning when it cannot be
    used (:func:`run_info_and_problem`)."""
    info, problem = run_info_and_problem(workdir)
    if problem:
        log.warning("%s %s: ignored", workdir / "run.json", problem)
    return info


def code_version() -> dict:
    """The code that runs: the package version (:func:`shared_data.core.commands.package_version`,
    also from a checkout) and, in a git checkout, the commit and whether the tree has changes."""
    version = {"package_version": package_version()}
    root = config_mod.REPO_ROOT
    if (root / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            )
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if commit.returncode == 0:
                return {**version, "git_commit": commit.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
        except (OSError, subprocess.SubprocessError):
            pass
    return version


#: The attributes of a generated data file that say which data a run was measured on
#: (:mod:`shared_data.data.generate`): its generator version, dark matter, gas, spectrum and volume.
DATA_ATTRS = ("generator", "dm", "gas", "spectrum", "grid_size", "box_size_mpc_h", "redshift", "seed")


def data_provenance(cfg: config_mod.Config) -> dict:
    """Which data a run reads: per split (``train``, ``val``) the HDF5 file's path and those of
    :data:`DATA_ATTRS` it has (a file of another writer, the tutorial's, has none), or ``error``
    where it cannot be read (the run's own reading reports that)."""
    import h5py

    out = {}
    for split in ("train", "val"):
        path = cfg.data_file(split)
        entry: dict = {"path": str(path)}
        try:
            with h5py.File(path, "r") as f:
                entry.update({k: f.attrs[k] for k in DATA_ATTRS if k in f.attrs})
        except OSError as err:
            entry["error"] = str(err)
        out[split] = json.loads(json.dumps(entry, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    return out


def record_invocation(workdir: Path, cfg: config_mod.Config, framework: str, start_epoch: int, versions: dict) -> None:
    """Append this invocation (command, folder, host, launch, versions, the data files' generator
    attributes (:func:`data_provenance`), the full config) to
    ``<workdir>/run.json``; a resume whose config differs from the last invocation's says what changed
    (:func:`recipe_changes`). A ``run.json`` that cannot be used (not JSON, not text, unreadable) is
    kept as ``run.json.damaged`` with a warning that says what is lost, and a new one starts from this
    invocation. Raises the ``OSError`` of a write that fails."""
    info, problem = run_info_and_problem(workdir)
    if problem:
        _set_aside_damaged_run_info(workdir, problem, start_epoch)
    invocations = info.get("invocations", [])
    values = json.loads(json.dumps(config_mod.config_dict(cfg)))  # as run.json holds them (lists, not tuples)
    if start_epoch and isinstance(info.get("config_values"), dict):
        base = json.loads(json.dumps(config_mod.config_dict(config_mod.load_config("base"))))
        changes = recipe_changes(info.get("config"), info["config_values"], cfg.name, values, base)
        if changes:
            log.warning("this resume changes the run's recipe from epoch %d: %s", start_epoch, "; ".join(changes))
    invocations.append(
        {
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "cwd": os.getcwd(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "start_epoch": start_epoch,
            "host": platform.node(),
            "launch": launch.launch_info(os.environ),
            "python": platform.python_version(),
            "code": code_version(),
            "versions": versions,
            "data": data_provenance(cfg),
            "config": cfg.name,
            "config_values": values,
        }
    )
    info.update(framework=framework, config=cfg.name, config_source=cfg.source, config_values=values)
    info["invocations"] = invocations
    write_atomic(workdir / "run.json", json.dumps(info, indent=1))


def _set_aside_damaged_run_info(workdir: Path, problem: str, start_epoch: int) -> None:
    """Keep a ``run.json`` that cannot be used as ``run.json.damaged`` (a file; anything else stays,
    and writing the new record then fails with its one line) and say what this run loses."""
    path = workdir / "run.json"
    kept = path.with_name("run.json.damaged")
    lost = "the record of the earlier invocations (commands, configs, versions) is not carried over"
    if start_epoch:
        lost += ", and this resume's config cannot be compared with the run's (no recipe-change check)"
    if path.is_file():
        os.replace(path, kept)
        log.warning("%s %s: kept as %s; a new run.json starts with this invocation: %s", path, problem, kept, lost)
    else:
        log.warning("%s %s: %s", path, problem, lost)


def recipe_changes(old_name, old: dict, new_name: str, new: dict, kit_base: dict | None = None) -> list[str]:
    """``key: old -> new`` for each config value (and the config name) that differs between two
    invocations of a run, in key order. A key the old values lack (one the kit added after that run
    was written) whose new value is its value in ``kit_base`` (the kit's ``base`` section, which keeps
    what the code did before the key existed) is no change."""
    changes = [f"config {old_name!r} -> {new_name!r}"] if old_name != new_name else []
    kit_base = kit_base or {}
    for key in sorted(set(old) | set(new)):
        if key not in old and key in kit_base and new.get(key) == kit_base[key]:
            continue
        if old.get(key) != new.get(key):
            changes.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return changes
