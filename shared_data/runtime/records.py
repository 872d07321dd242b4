"""What a run records in its folder besides checkpoints: TensorBoard scalars under the tutorial's tags,
``metrics.jsonl`` (one record per epoch), ``run.json`` (the invocations) and the code version.

Files are written atomically (:mod:`shared_data.core.files`); records of a resumed or multi-process run
are appended, never replaced, and readers skip a torn line with a warning.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import types
from pathlib import Path

from shared_data.core import config as config_mod
from shared_data.core.files import write_atomic

log = logging.getLogger("dlas")


class ScalarWriter:
    """TensorBoard scalars through ``tensorboard.summary.Writer`` (neither TF nor tensorboardX needed);
    a warning and no-op when ``tensorboard`` is missing, a no-op when disabled."""

    def __init__(self, logdir: Path, enabled: bool):
        self._writer = None
        if not enabled:
            return
        try:
            from tensorboard.summary import Writer
        except ImportError:
            log.warning("tensorboard is not installed: no TensorBoard scalars (pip install tensorboard)")
            return
        # tensorboard does its file I/O through TensorFlow when TF is installed, unless its "notf"
        # marker module exists when that choice is first made (it is cached); a JAX run keeps TF out
        # of its process. The marker is removed again so a later tf.summary user is unaffected.
        marker = "tensorboard.compat.notf"
        added = "tensorflow" not in sys.modules and marker not in sys.modules
        if added:
            sys.modules[marker] = types.ModuleType(marker)
        try:
            self._writer = Writer(str(logdir))
        finally:
            if added:
                del sys.modules[marker]

    def scalars(self, step: int, values: dict) -> None:
        """Write ``values`` (tag -> number) at global step ``step``."""
        if self._writer is not None:
            for tag, value in values.items():
                self._writer.add_scalar(tag, float(value), step)
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


def read_run_info(workdir: Path) -> dict:
    """``<workdir>/run.json`` as a dict; empty when missing, and empty with a warning when damaged."""
    path = workdir / "run.json"
    if not path.exists():
        return {}
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        log.warning("%s is not valid JSON (a damaged file?): a new one is written", path)
        return {}
    return info if isinstance(info, dict) else {}


def code_version() -> dict:
    """The code that runs: the git commit (and whether the tree has changes) of a checkout, else the
    installed package version."""
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
                return {"git_commit": commit.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
        except (OSError, subprocess.SubprocessError):
            pass
    from importlib import metadata

    try:
        return {"package_version": metadata.version("dlas-cosmo")}
    except metadata.PackageNotFoundError:
        return {"package_version": "unknown"}
