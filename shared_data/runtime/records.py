"""What a run records in its folder besides checkpoints: TensorBoard scalars under the tutorial's tags and
the config as hparams,
``metrics.jsonl`` (one record per epoch), ``run.json`` (the invocations) and the code version.

Files are written atomically (:mod:`shared_data.core.files`); records of a resumed or multi-process run
are appended, never replaced, and readers skip a torn line with a warning.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path

from shared_data.core import config as config_mod
from shared_data.core.commands import package_version
from shared_data.core.files import write_atomic

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

    def amend_last(self, fields: dict) -> None:
        """Add ``fields`` to the last epoch record (an atomic rewrite of the file)."""
        if self.enabled and self.path.exists():
            records = read_metrics(self.path.parent)
            if records:
                records[-1].update(fields)
                write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in records))

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
