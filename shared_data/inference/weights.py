"""The weights a prediction or an export uses: ``--weights`` (a canonical ``.npz``) or ``--workdir`` (a run).

``--weights`` names a canonical weights file (:func:`shared_data.model.unet_spec.load_weights`).
``--workdir`` names a training run folder: the weights it evaluated (its ``weights.npz``, written at
the run's end: :func:`run_weights`), else its latest checkpoint, restored by a framework's ``restore``
with the config the run trained with (:func:`checkpoint_config`). :func:`load_weights` chooses and
:func:`describe_weights` names the choice, as logged and recorded in the outputs' provenance.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shared_data.core import config as config_mod
from shared_data.core import config_checks
from shared_data.core.config import Config
from shared_data.core.errors import ConfigError, UserError
from shared_data.model import unet_spec
from shared_data.runtime import resume

log = logging.getLogger("dlas.predict")

#: Model keys that decide the shapes of the weights (a checkpoint restores only into the same ones).
MODEL_KEYS = ("N_in_channels", "N_out_channels", "unet_widths", "full_scale")


def add_weights_args(parser: argparse.ArgumentParser) -> None:
    """``--weights`` (a canonical ``.npz``) or ``--workdir`` (a run folder: :func:`load_weights`), one required."""
    g = parser.add_argument_group("weights").add_mutually_exclusive_group(required=True)
    g.add_argument("--weights", help="canonical weights file (.npz), e.g. the trainer's --save_weights")
    g.add_argument(
        "--workdir",
        help="a training run folder: the weights it evaluated (its weights.npz, written at the run's end), "
        "else its latest checkpoint",
    )


def weights_inputs(args: argparse.Namespace) -> dict[str, str | Path | None]:
    """The files ``predict`` and ``export`` read their weights from: ``--weights``, or the run
    folder's ``run.json``, ``checkpoints`` and ``weights.npz`` of ``--workdir``."""
    if args.weights:
        return {"--weights": args.weights}
    return {f"--workdir's {name}": Path(args.workdir) / name for name in ("run.json", "checkpoints", "weights.npz")}


def checkpoint_dir(workdir: str | Path) -> Path:
    """``<workdir>/checkpoints``.

    Raises:
        UserError: ``workdir`` or its ``checkpoints`` folder does not exist.
    """
    directory = Path(workdir) / "checkpoints"
    if not directory.is_dir():
        raise UserError(f"--workdir {workdir}: no checkpoints folder {directory} (a run folder of the trainer?)")
    return directory


def checkpoint_config(cfg: Config, workdir: str | Path) -> Config:
    """The config a run in ``workdir`` trained with (its ``run.json``), which decides the structure of
    its checkpoints (optimizer state, fp16 loss scale); ``cfg`` itself when there is no ``run.json``.

    Raises:
        ConfigError: the run's model keys (:data:`MODEL_KEYS`) differ from ``cfg``'s.
    """
    from shared_data.runtime.records import read_run_info

    values = read_run_info(Path(workdir)).get("config_values")
    if not isinstance(values, dict):
        return cfg
    # a key the run's config lacks (added to the kit after the run) takes ``cfg``'s value
    run_cfg = config_checks.make_config({**config_mod.config_dict(cfg), **values}, cfg.name, f"{workdir}/run.json")
    for key in MODEL_KEYS:
        if getattr(run_cfg, key) != getattr(cfg, key):
            raise ConfigError(
                f"--workdir {workdir} was trained with {key} = {getattr(run_cfg, key)!r}, config "
                f"{cfg.name!r} has {getattr(cfg, key)!r}: pass the run's --config"
            )
    return run_cfg


def restore_newest(checkpoints, workdir: str | Path, restore: Callable[[int], object]) -> tuple[int, object]:
    """The newest checkpoint of a framework's ``Checkpoints`` (``epochs()``) that ``restore(epoch)``
    restores: ``(epoch, what it returned)``; a damaged one is skipped with a warning, as the trainer's
    resume skips it (:func:`shared_data.runtime.resume.restore_newest`).

    Raises:
        UserError: there is none, or none restores (the newest one's error).
    """
    epochs = checkpoints.epochs()
    if not epochs:
        raise UserError(f"--workdir {workdir}: no checkpoint in {checkpoint_dir(workdir)}")
    return resume.restore_newest(epochs, restore)


#: A framework's checkpoint restore: (the run's config, its checkpoints folder, workdir) -> (canonical
#: weights, epoch).
Restore = Callable[[Config, Path, str], tuple[dict[str, np.ndarray], int]]


def load_weights(
    cfg: Config, weights: str | None, workdir: str | None, restore: Restore
) -> tuple[dict[str, np.ndarray], str]:
    """Canonical weights from the ``.npz`` file ``weights``, or those the run in ``workdir`` evaluated
    (:func:`run_weights`: with ``ema_decay`` the weight average, which its checkpoints do not hold),
    else its latest checkpoint through a framework's ``restore(run_cfg, checkpoints_folder, workdir) ->
    (canonical weights, epoch)``; and their description, naming which.

    Raises:
        UserError: a missing or mismatched weights file, no checkpoint, a checkpoint of another config,
            weights holding NaN or inf (:func:`shared_data.model.unet_spec.check_finite_weights`).
    """
    if weights:
        return unet_spec.load_weights(weights, cfg), describe_weights(weights, None)
    directory = checkpoint_dir(workdir)
    run_cfg = checkpoint_config(cfg, workdir)
    evaluated = run_weights(workdir)
    if evaluated is not None:
        what = "the weight average it evaluated" if run_cfg.ema_decay else "its final weights"
        return unet_spec.load_weights(evaluated, cfg), f"the run's {evaluated.absolute()} ({what})"
    canonical, epoch = restore(run_cfg, directory, workdir)
    if run_cfg.ema_decay:
        log.warning(
            "the run in %s evaluated a weight average (ema_decay %g) and left no current weights.npz: its "
            "checkpoint holds the trained weights, not that average",
            workdir,
            run_cfg.ema_decay,
        )
    unet_spec.check_finite_weights(canonical, f"the checkpoint of epoch {epoch} in {directory}")
    return canonical, describe_weights(None, workdir, epoch)


def run_weights(workdir: str | Path) -> Path | None:
    """``<workdir>/weights.npz`` when the run's end wrote it after its newest checkpoint (the weights
    the run evaluated: the trainer writes them there at its end for a run with a weight average or a
    quality target, or with ``--save_weights`` into the run folder), else None."""
    path = Path(workdir) / "weights.npz"
    if not path.is_file():
        return None
    saved = [f.stat().st_mtime for f in (Path(workdir) / "checkpoints").rglob("*") if f.is_file()]
    return path if not saved or max(saved) <= path.stat().st_mtime else None


def describe_weights(weights: str | None, workdir: str | None, epoch: int | None = None) -> str:
    """The one-phrase description of where weights come from, as logged and recorded."""
    if weights:
        return f"weights {Path(weights).absolute()}"
    return f"checkpoint {Path(workdir).absolute() / 'checkpoints'} epoch {epoch}"
