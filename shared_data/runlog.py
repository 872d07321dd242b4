"""What a training run prints and records, identical for TF and JAX: log lines, the run folder,
the progress bar, and the metrics history (``metrics.jsonl``) the comparison tools read.

The epoch lines are the NERSC tutorial's::

    Time taken for epoch 1 is 12.3 sec, avg 166.4 samples/sec
      Avg train loss=0.051234
      Avg val loss=0.049876
      Total validation time: 0.8 sec
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import platform
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator

from shared_data.config import Config, batch_sizes, config_dict
from shared_data.errors import UserError

log = logging.getLogger("dlas")


def setup_logging(level: int = logging.INFO) -> None:
    """One stream handler on stdout with a short format (idempotent)."""
    root = logging.getLogger()
    if not any(getattr(h, "_dlas", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        handler._dlas = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("absl", "jax._src", "orbax", "tensorflow", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def workdir_for(cfg: Config, framework: str, workdir: str | None = None) -> Path:
    """The run folder: ``workdir`` if given, else ``<exp_dir>/<config name>/<framework>``."""
    return Path(workdir) if workdir else cfg.resolve_path(cfg.exp_dir) / cfg.name / framework


def add_run_args(parser: argparse.ArgumentParser, framework: str) -> None:
    """The trainers' run flags (both frameworks take the same): run folder, resume, devices, weights."""
    run = parser.add_argument_group("run")
    run.add_argument("--workdir", help=f"run folder (default: <exp_dir>/<config>/{framework})")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run folder")
    run.add_argument("--overwrite", action="store_true", help="delete the run folder's checkpoints and start again")
    run.add_argument("--num_devices", type=int, help="use the first N devices (default: all)")
    run.add_argument("--init_weights", help="canonical weights file (.npz) to start from")
    run.add_argument("--stop_after_epoch", type=int, help="end this invocation after that epoch (like a job time limit); --resume continues")
    run.add_argument("--save_weights", help="write the final weights to this canonical .npz file")


def check_run_args(args: argparse.Namespace, workdir: Path, framework: str) -> None:
    """Reject run flags that cannot work before any training starts.

    Raises:
        UserError: ``--resume`` with ``--overwrite``; a run folder that is a file or belongs to the
            other framework; ``--num_devices`` below 1; a ``--save_weights`` folder that does not exist.
    """
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite conflict: give one")
    if workdir.exists() and not workdir.is_dir():
        raise UserError(f"--workdir {workdir} is a file, expected a folder")
    info = workdir / "run.json"
    if info.exists():
        other = json.loads(info.read_text()).get("framework")
        if other and other != framework:
            raise UserError(f"{workdir} holds a {other} run; use another --workdir for {framework}")
    if args.num_devices is not None and args.num_devices < 1:
        raise UserError(f"--num_devices {args.num_devices}: expected at least 1")
    if args.save_weights:
        folder = Path(args.save_weights).absolute().parent
        if not folder.is_dir() and folder != workdir.absolute():  # the run folder itself is made by the run
            raise UserError(f"--save_weights {args.save_weights}: folder {folder} does not exist")


def log_setup(cfg: Config, settings: dict, replicas: int) -> tuple[int, int]:
    """Log a run's framework settings (``configure_xla``'s), precision policy and data-parallel
    layout, the same lines in TF and JAX; return ``(global, local)`` batch sizes (raises the
    :func:`shared_data.config.batch_sizes` error when the batch does not divide over ``replicas``)."""
    for key, value in settings.items():
        log.info("  %s = %s", key, "(unset)" if value == "" else value)
    global_bs, local_bs = batch_sizes(cfg, replicas)
    log.info("precision: %s compute, float32 parameters%s", cfg.precision,
             ", dynamic loss scaling" if cfg.precision == "float16" else "")
    log.info("data parallel: %d replicas, global batch %d, local batch %d", replicas, global_bs, local_bs)
    log.info("input: %s loader, %d^3 crops, symmetries %s", cfg.data_loader_config, cfg.crop_size, cfg.symmetry_group)
    return global_bs, local_bs


def check_data(cfg: Config) -> None:
    """Check, before anything in a run folder is touched, that the data of ``cfg`` exist and follow the
    contract: both split files (unless ``synthetic``) and, for ``dali-npy`` / ``dali-lowmem``, their
    ``.npy`` forms. Raises the :class:`shared_data.errors.DatasetError` naming the file and the fix."""
    from shared_data import dataset
    from shared_data.dali_pipelines import check_npy
    if cfg.data_loader_config == "synthetic":
        return
    for key in ("train_path", "val_path"):
        path = cfg.resolve_path(getattr(cfg, key))
        dataset.validate(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
        check_npy(cfg.data_loader_config, path)


def clear_checkpoints(workdir: Path, overwrite: bool) -> None:
    """With ``--overwrite``, delete ``<workdir>/checkpoints`` (the only way a run discards work)."""
    if overwrite and (workdir / "checkpoints").exists():
        shutil.rmtree(workdir / "checkpoints")


def start_epoch(latest: int | None, resume: bool, workdir: Path) -> int:
    """Epoch to start from: the latest checkpoint's with ``--resume``, else 0 on an empty run folder.

    Raises:
        UserError: the run folder holds checkpoints and neither ``--resume`` nor ``--overwrite`` was given.
    """
    if latest is None:
        if resume:
            log.info("no checkpoint in %s: starting from scratch", workdir)
        return 0
    if resume:
        return latest
    raise UserError(f"{workdir} already holds checkpoints (epoch {latest}); pass --resume to continue, "
                    f"--overwrite to start again, or --workdir for a new run")


def epoch_lines(epoch: int, seconds: float, samples: int, train_loss: float, val_loss: float, val_seconds: float) -> list[str]:
    """The tutorial's per-epoch log lines (``epoch`` counted from 1)."""
    return [f"Time taken for epoch {epoch} is {seconds:.1f} sec, avg {samples / seconds:.1f} samples/sec",
            f"  Avg train loss={train_loss:.6f}",
            f"  Avg val loss={val_loss:.6f}",
            f"  Total validation time: {val_seconds:.1f} sec"]


def progress(iterable: Iterable, total: int, desc: str, enabled: bool) -> Iterator:
    """A tqdm progress bar over ``iterable`` when ``enabled`` and stdout is a terminal-ish stream."""
    if not enabled:
        return iter(iterable)
    from tqdm import tqdm
    return iter(tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True, mininterval=1.0))


class MetricsLog:
    """Appends one JSON object per epoch to ``<workdir>/metrics.jsonl`` and writes ``run.json``;
    does nothing when ``enabled`` is False (every process but the first in a multi-process run)."""

    def __init__(self, workdir: Path, cfg: Config, framework: str, versions: dict, enabled: bool = True):
        self.path, self.enabled = workdir / "metrics.jsonl", enabled
        if not enabled:
            return
        workdir.mkdir(parents=True, exist_ok=True)
        info = dict(framework=framework, config=cfg.name, config_values=config_dict(cfg), versions=versions,
                    host=platform.node(), python=platform.python_version(), started=time.strftime("%Y-%m-%d %H:%M:%S"))
        (workdir / "run.json").write_text(json.dumps(info, indent=1))

    def append(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def truncate_after(self, epoch: int) -> None:
        """Drop records of epochs > ``epoch`` (after a resume from that epoch's checkpoint)."""
        if self.enabled and self.path.exists():
            keep = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["epoch"] <= epoch]
            self.path.write_text("".join(line + "\n" for line in keep))


def read_metrics(workdir: str | Path) -> list[dict]:
    """The records of ``metrics.jsonl`` in ``workdir`` (empty if none)."""
    path = Path(workdir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []
