"""Time to quality: train until the model meets a physics target on the held-out volume, and time it.

    python -m jax_impl.train --config short --set quality_every_epochs=1      (same for tf_impl.train)

MLPerf-HPC style (its rules time a run from its start to the evaluation that reaches the target): with
``quality_every_epochs: N`` (> 0) the trainer predicts the whole validation volume (``val_path``)
after every N-th epoch with the model as it stands (its weight average when ``ema_decay`` is on),
through the full-volume code path of ``predict`` (:func:`shared_data.inference.tiling.predict_volume`,
seamless windows, float32 compute), scores it with :func:`shared_data.inference.metrics.compute_metrics`
and tests the target of :class:`Target`:

* for gas density and gas temperature, in every k bin (centre k <= ``quality_k_max`` h/Mpc, at least
  one mode): r(k) >= ``quality_r_min`` and |P_pred / P_true - 1| <= ``quality_ratio_tol``, the
  temperature's against ``quality_temperature_r_min`` and ``quality_temperature_ratio_tol`` where
  those are set (a gas whose temperature a model predicts less well than its density needs its own);
* with ``quality_beat_baseline``: temperature r(k) >= the dark-matter baseline's r(k) in those bins;
* with ``quality_beat_non_ml``: gas density and temperature r(k) >= the non-ML baseline's r(k) (the
  Jeans-filtered dark matter with the mean temperature-density relation,
  :func:`shared_data.inference.metrics.non_ml_channels`) in every one of those bins.

The absolute thresholds (``quality_r_min``, ``quality_ratio_tol``, ``quality_k_max``) are the ones
chosen on the ``filtered`` gas; on the default ``nonlinear`` gas they are to be re-chosen from what
the H200 reaches.

The run stops after the first evaluation that meets it, or at the first epoch end past
``quality_budget_sec`` seconds from the start (the model then at hand is evaluated too), or after
``num_epochs``. Records, in the run folder (main process):

* ``quality.jsonl``: one JSON line per evaluation, the curve against time: ``epoch``, ``step``,
  ``time_sec`` (start of the run to the end of this evaluation), ``train_time_sec`` (the same without
  the evaluations' own time), ``eval_sec``, ``target`` (the one judged), ``met``, ``shortfall``
  (below) and per channel the binned ``k``, ``r``, ``ratio``, ``r_baseline``, ``r_non_ml`` and their
  worst values;
* ``metrics.jsonl``: the evaluated epoch's record gets ``quality_time_sec``, ``quality_met`` and
  ``quality_shortfall``, and the one that met the target ``time_to_quality_sec``, ``framework``, ``device``;
* ``run.json``: ``time_to_quality`` with ``time_to_quality_sec`` (the ``time_sec`` of the evaluation
  that met the target; null when none did), ``train_sec_to_quality``, ``framework``, ``device``, the
  target, the number of evaluations, the reason the run stopped and ``best``: the evaluation with the
  smallest shortfall (the target's result when met, the best reached otherwise).

The clock starts when the trainer opens its :class:`shared_data.runtime.run_folder.RunFolder` (after the framework
has been imported), so ``time_to_quality_sec`` counts everything after that as MLPerf does: reading the
data, compiling, training, the per-epoch validation loss, checkpoints and the quality evaluations.
``train_sec_to_quality`` leaves the quality evaluations out (the price of measuring, not of
training). A resumed run's clock continues from the last evaluation it keeps (the one at or before
the epoch it resumes from): the interrupted invocation's time after that evaluation is not counted,
the resumed invocation's own start (reading, compiling) is, and ``quality_budget_sec`` counts on
this clock, so a run stopped by its budget resumes with a larger one. The kept evaluations judged
against the same target keep their verdicts: a run that has met it trains no further epoch.

The shortfall of an evaluation is the largest violation of a condition, in units of the condition's
margin: (r_min - r) / (1 - r_min), (|ratio - 1| - tol) / tol, (r_baseline - r) / (1 - r_min) and
(r_non_ml - r) / (1 - r_min), each with its channel's r_min and tol, maximised over the bins and
channels; the target holds exactly when it is <= 0.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shared_data.core.config import Config
from shared_data.core.errors import ConfigError, UserError
from shared_data.core.files import write_atomic
from shared_data.inference import predict as predict_mod
from shared_data.inference import tiling
from shared_data.inference.metrics import compute_metrics, to_json
from shared_data.inference.units import DENSITY, QUANTITIES, TEMPERATURE, read_volume, units_from_files
from shared_data.model import unet_spec
from shared_data.runtime.records import read_run_info

log = logging.getLogger("dlas")

CHANNELS = (DENSITY, TEMPERATURE)
RECORD = "quality.jsonl"


@dataclasses.dataclass(frozen=True)
class Target:
    """The physics target (config keys ``quality_*``): r(k) >= ``r_min`` and |P ratio - 1| <= ``ratio_tol``
    in every bin up to ``k_max`` h/Mpc for gas density and temperature, with ``beat_baseline`` the
    temperature's r(k) at least the dark-matter baseline's, and with ``beat_non_ml`` both channels'
    r(k) at least the non-ML baseline's. ``temperature_r_min`` and ``temperature_ratio_tol``, where
    not None, replace ``r_min`` and ``ratio_tol`` for the temperature (:meth:`thresholds`)."""

    r_min: float
    ratio_tol: float
    k_max: float
    beat_baseline: bool
    beat_non_ml: bool = False
    temperature_r_min: float | None = None
    temperature_ratio_tol: float | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> Target:
        return cls(
            cfg.quality_r_min,
            cfg.quality_ratio_tol,
            cfg.quality_k_max,
            cfg.quality_beat_baseline,
            cfg.quality_beat_non_ml,
            cfg.quality_temperature_r_min,
            cfg.quality_temperature_ratio_tol,
        )

    def thresholds(self, name: str) -> tuple[float, float]:
        """(r_min, ratio_tol) of channel ``name``: the temperature's own where set, else the shared ones."""
        if name == TEMPERATURE:
            return (
                self.r_min if self.temperature_r_min is None else self.temperature_r_min,
                self.ratio_tol if self.temperature_ratio_tol is None else self.temperature_ratio_tol,
            )
        return self.r_min, self.ratio_tol

    def describe(self) -> str:
        """The thresholds in words, as the trainers log them."""
        rho, temp = self.thresholds(DENSITY), self.thresholds(TEMPERATURE)
        if rho == temp:
            text = f"r >= {rho[0]:g}, |P ratio - 1| <= {rho[1]:g}"
            text += f" up to k = {self.k_max:g} h/Mpc for gas density and temperature"
        else:
            text = (
                f"in every bin up to k = {self.k_max:g} h/Mpc gas density r >= {rho[0]:g}, |P ratio - 1| <= "
                f"{rho[1]:g} and gas temperature r >= {temp[0]:g}, |P ratio - 1| <= {temp[1]:g}"
            )
        return (
            text
            + (", temperature r >= the baseline's" if self.beat_baseline else "")
            + (", r >= the non-ML baseline's" if self.beat_non_ml else "")
        )


def check(metrics: dict, target: Target) -> dict:
    """Test ``target`` on ``metrics`` (:func:`shared_data.inference.metrics.compute_metrics`' result).

    Returns ``{"met": bool, "shortfall": float, "channels": {name: {...}}}``, per channel the bins
    tested (``k``, ``r``, ``ratio``, ``r_baseline``, ``r_non_ml`` as lists) and ``r_worst``,
    ``ratio_dev_worst``, ``r_minus_baseline_worst`` (None without a baseline or for density),
    ``r_minus_non_ml_worst`` (None when not tested), the channel's shortfall and ``constant``: the
    prediction has no power in any tested bin (a constant field, whose r is undefined: a collapsed model).
    A NaN in a tested bin (an empty or zero spectrum) fails the target (shortfall inf).

    Raises:
        ValueError: no bin lies at or below ``k_max`` (the volume is too small for the target), or
            ``beat_non_ml`` is on and the metrics have no non-ML baseline (the volume lacks
            ``k_jeans_h_mpc`` or ``igm_gamma``).
    """
    out, worst = {}, -math.inf
    for name in CHANNELS:
        r_min, ratio_tol = target.thresholds(name)
        margin = max(1.0 - r_min, 1e-12)
        s = metrics["power"][name]
        k, n = np.asarray(s["k"], np.float64), np.asarray(s["n_modes"])
        sel = (k <= target.k_max) & (n > 0)
        if not sel.any():
            raise ValueError(f"no k bin at or below quality_k_max = {target.k_max} h/Mpc (first bin at {k[0]:.3g})")
        r, ratio = np.asarray(s["r_pred"], np.float64)[sel], np.asarray(s["ratio_pred"], np.float64)[sel]
        dev = np.abs(ratio - 1.0)
        parts = [(r_min - r) / margin, (dev - ratio_tol) / max(ratio_tol, 1e-12)]
        base = None
        if name == TEMPERATURE and target.beat_baseline and "r_baseline" in s:
            base = np.asarray(s["r_baseline"], np.float64)[sel]
            parts.append((base - r) / margin)
        non_ml = None
        if target.beat_non_ml:
            if "r_non_ml" not in s:
                raise ValueError(
                    "quality_beat_non_ml needs the non-ML baseline, which needs the volume's k_jeans_h_mpc and "
                    "igm_gamma attributes"
                )
            non_ml = np.asarray(s["r_non_ml"], np.float64)[sel]
            parts.append((non_ml - r) / margin)
        stacked = np.concatenate(parts)
        shortfall = float(np.max(stacked)) if np.isfinite(stacked).all() else math.inf
        worst = max(worst, shortfall)
        out[name] = {
            "k": k[sel].tolist(),
            "r": r.tolist(),
            "ratio": ratio.tolist(),
            "r_baseline": None if base is None else base.tolist(),
            "r_non_ml": None if non_ml is None else non_ml.tolist(),
            "r_worst": float(np.min(r)),
            "ratio_dev_worst": float(np.max(dev)),
            "r_minus_baseline_worst": None if base is None else float(np.min(r - base)),
            "r_minus_non_ml_worst": None if non_ml is None else float(np.min(r - non_ml)),
            "shortfall": shortfall,
            "constant": "P_pred" in s and bool(np.all(np.asarray(s["P_pred"], np.float64)[sel] == 0.0)),
        }
    return {"met": worst <= 0.0, "shortfall": worst, "channels": out}


def read_records(workdir) -> list[dict]:
    """The evaluations of ``<workdir>/quality.jsonl``, oldest first (empty if none; a torn line is skipped)."""
    path = Path(workdir) / RECORD
    if not path.exists():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("epoch"), int):
            records.append(record)
    return records


def _restored(record: dict) -> dict | None:
    """A kept evaluation record for the resumed clock: its times as floats and a null shortfall (a
    non-finite one, written as null) as inf; None when a time is missing, not a number, not finite or
    negative."""
    times = [record.get(k) for k in ("time_sec", "train_time_sec")]
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0 for t in times):
        return None
    shortfall = record.get("shortfall")
    shortfall = math.inf if not isinstance(shortfall, (int, float)) else float(shortfall)
    return {**record, "time_sec": float(times[0]), "train_time_sec": float(times[1]), "shortfall": shortfall}


def _judged(record: dict, target: Target) -> bool:
    """Whether evaluation ``record`` was judged against ``target``: its ``target`` with the fields a record
    may lack (those with defaults, added to :class:`Target` after the record was written) at their
    defaults equals ``target``'s."""
    written = record.get("target")
    if not isinstance(written, dict):
        return False
    defaults = {f.name: f.default for f in dataclasses.fields(Target) if f.default is not dataclasses.MISSING}
    return {**defaults, **written} == dataclasses.asdict(target)


def summary_line(epoch: int, seconds: float, result: dict) -> str:
    """The log line of one evaluation (the same in both frameworks)."""
    parts = []
    for name, c in result["channels"].items():
        text = f"{name} r >= {c['r_worst']:.4f}, |P ratio - 1| <= {c['ratio_dev_worst']:.4f}"
        if c["r_minus_baseline_worst"] is not None:
            text += f", r - baseline r >= {c['r_minus_baseline_worst']:+.4f}"
        if c.get("r_minus_non_ml_worst") is not None:
            text += f", r - non-ML r >= {c['r_minus_non_ml_worst']:+.4f}"
        parts.append(text)
    verdict = "target met" if result["met"] else f"target not met (shortfall {result['shortfall']:.3g})"
    constant = [name for name, c in result["channels"].items() if c.get("constant")]
    if constant:
        verdict += (
            f"; the model predicts a constant {' and '.join(constant)}: training has collapsed "
            "(a lower start_lr, or loss_space log, may keep it from diverging)"
        )
    return f"quality after epoch {epoch} ({seconds:.1f} s from the start): " + "; ".join(parts) + f": {verdict}"


class Monitor:
    """The time-to-quality mode of a trainer's run in ``folder`` (a
    :class:`shared_data.runtime.run_folder.RunFolder`; off when ``quality_every_epochs`` is 0: every
    method then does nothing). ``metrics`` is the run's ``metrics.jsonl``
    (:class:`shared_data.runtime.records.MetricsLog`), whose epoch records gain the verdicts.

    The trainer loops over the :meth:`remaining` epochs; after each epoch's checkpoint it evaluates
    when :meth:`due` (:meth:`evaluate`) and stops when :meth:`stops`; then :meth:`finish`.
    ``agree(flag)`` returns process 0's flag on every process of a multi-process run (each process's
    clock and evaluation are its own; a process that stops alone leaves the others waiting in a
    collective). ``device`` names the accelerator for the records;
    ``start_epoch`` is where the run starts (records of later epochs, from an earlier run, are dropped).
    The validation volume is read at construction, so a missing file or attribute fails before training.

    Raises:
        UserError: a resumed run's kept evaluation has no finite, non-negative times to continue the
            clock from.
        DatasetError: the validation file breaks the dataset contract or lacks the attributes the
            metrics need (:func:`shared_data.inference.units.units_from_files`).
        ConfigError: ``quality_k_max`` lies below the volume's first k bin or above its Nyquist
            wavenumber ``pi / voxel size``, or ``quality_beat_non_ml`` is on and the volume lacks what
            the non-ML baseline needs.
    """

    def __init__(self, folder, metrics, device: str, start_epoch: int = 0, agree: Callable[[bool], bool] = bool):
        self.folder, self.metrics, self.cfg, self.device = folder, metrics, folder.cfg, device
        self.agree = agree  # process 0's decision on every process, so all stop after the same epoch
        self.enabled = folder.cfg.quality_every_epochs > 0
        self.predict_cfg = predict_mod.prediction_config(folder.cfg, "float32")
        self.target = Target.from_config(folder.cfg)
        self.evaluations, self.best, self.reached = 0, None, None
        self.eval_total, self.stopped, self.clock_offset = 0.0, "num_epochs trained", 0.0
        self._over, self._met = False, None  # after an epoch: the budget spent, the evaluation's verdict
        if not self.enabled:
            return
        # A fresh or resumed run keeps the curve up to the epoch it starts from (process 0 rewrites the file
        # once the checks below have passed); a resumed one continues its clock from the last evaluation
        # kept and keeps the verdicts of those judged against this target.
        keep = [r for r in read_records(folder.workdir) if r["epoch"] <= start_epoch] if start_epoch else []
        self._restore(keep, start_epoch)
        path = folder.cfg.data_file("val")
        self.truth, attrs = read_volume(path, "Hydro")
        self.nbody, _ = read_volume(path, "Nbody")
        side = self.truth.shape[1]
        self.units = units_from_files({path: attrs}, side, {}, flags_given=False)
        first_k = 2 * np.pi / (side * self.units.voxel_size)
        nyquist = np.pi / self.units.voxel_size
        if self.target.k_max > nyquist:
            raise ConfigError(
                f"quality_k_max = {self.target.k_max} h/Mpc lies above the Nyquist wavenumber ({nyquist:.3g} h/Mpc, "
                f"pi / the voxel size {self.units.voxel_size:g} Mpc/h) of {path}: no bin there to test"
            )
        if self.target.k_max < first_k:
            raise ConfigError(
                f"quality_k_max = {self.target.k_max} h/Mpc lies below the first k bin ({first_k:.3g} h/Mpc) of "
                f"{path}: no bin to test"
            )
        missing = [k for k in ("k_jeans", "igm_gamma") if getattr(self.units, k) is None]
        if self.target.beat_non_ml and missing:
            raise ConfigError(
                f"quality_beat_non_ml: {path} has no {' or '.join(QUANTITIES[k][0] for k in missing)} "
                "attribute, which the non-ML baseline needs; set quality_beat_non_ml=false"
            )
        self.align = tiling.alignment(self.predict_cfg)
        self.overlap = unet_spec.receptive_margin(self.predict_cfg)
        self.size = tiling.padded_side(side, self.align)
        self.window = tiling.choose_window(
            self.predict_cfg, self.size, None, self.overlap, "float32", tiling.DEFAULT_MEMORY_GB
        )
        x = np.ascontiguousarray(np.moveaxis(self.nbody, 0, -1))
        self.x = np.pad(x, [(0, self.size - side)] * 3 + [(0, 0)])
        if folder.main:
            write_atomic(folder.workdir / RECORD, "".join(json.dumps(r) + "\n" for r in keep))
        log.info(
            "time to quality: the whole %s (%d^3) every %d epoch(s); target %s%s",
            path.name,
            side,
            folder.cfg.quality_every_epochs,
            self.target.describe(),
            f"; budget {folder.cfg.quality_budget_sec:g} s" if folder.cfg.quality_budget_sec else "",
        )

    def _restore(self, keep: list[dict], start_epoch: int) -> None:
        """The clock, evaluation count, best and reached evaluation of a resumed run from the records
        it keeps (:func:`_restored`); the best and reached ones only among the evaluations judged
        against this target (each record holds its ``target``).

        Raises:
            UserError: a kept record has no finite, non-negative ``time_sec`` / ``train_time_sec``.
        """
        if not keep:
            if start_epoch:
                log.warning(
                    "time to quality: resumed at epoch %d with no evaluation kept in %s: the clock starts at 0 "
                    "(the time before this invocation is not counted)",
                    start_epoch,
                    self.folder.workdir / RECORD,
                )
            return
        kept = [_restored(r) for r in keep]
        bad = next((r for r, k in zip(keep, kept) if k is None), None)
        if bad is not None:
            raise UserError(
                f"{self.folder.workdir / RECORD}: the evaluation of epoch {bad['epoch']} has no finite, non-negative "
                "time_sec and train_time_sec, which the resumed clock continues from; remove that line (or the "
                "file, to restart the clock at 0) and resume again"
            )
        last = kept[-1]
        self.clock_offset = last["time_sec"]
        self.eval_total = last["time_sec"] - last["train_time_sec"]
        self.evaluations = len(kept)
        same = [r for r in kept if _judged(r, self.target)]
        self.best = min(same, key=lambda r: r["shortfall"]) if same else None
        self.reached = next((r for r in same if r.get("met")), None)
        log.info(
            "time to quality: resumed; the clock continues from epoch %d's evaluation at %.1f s%s",
            last["epoch"],
            self.clock_offset,
            "" if len(same) == len(kept) else f" ({len(kept) - len(same)} kept evaluation(s) judged another target)",
        )

    def remaining(self, epochs: range) -> range:
        """``epochs`` (:meth:`shared_data.runtime.run_folder.RunFolder.epochs`), or none when a resumed run has met
        the target already (the trainers loop over this)."""
        if self.enabled and self.reached is not None:
            self.stopped = f"target met after epoch {self.reached['epoch']}, before this invocation"
            log.info("time to quality: the target was met after epoch %d: nothing to train", self.reached["epoch"])
            return range(0)
        return epochs

    def elapsed(self) -> float:
        """Seconds of the run's clock: since this invocation started
        (:attr:`shared_data.runtime.run_folder.RunFolder.started`), plus, in a resumed run, the clock of the last
        evaluation it keeps."""
        return self.clock_offset + time.perf_counter() - self.folder.started

    def evaluate(self, epoch: int, step: int, apply: tiling.Apply) -> dict:
        """Predict the volume with ``apply`` (NDHWC float32 windows -> outputs), score it, record and
        log the evaluation after ``epoch`` epochs (``step`` optimizer steps); return its record."""
        t0 = time.perf_counter()
        side = self.truth.shape[1]
        hydro, _ = tiling.predict_volume(self.x, apply, self.cfg.N_out_channels, self.window, self.overlap, self.align)
        pred = np.ascontiguousarray(np.moveaxis(hydro[:side, :side, :side], -1, 0))
        result = check(compute_metrics(pred, self.truth, self.nbody, self.units), self.target)
        seconds = time.perf_counter() - t0
        self.eval_total += seconds
        self.evaluations += 1
        now = self.elapsed()
        record = {
            "epoch": epoch,
            "step": step,
            "time_sec": now,
            "train_time_sec": now - self.eval_total,
            "eval_sec": seconds,
            "target": dataclasses.asdict(self.target),
            **result,
        }
        if self.folder.main:
            with open(self.folder.workdir / RECORD, "a") as fh:
                fh.write(json.dumps(to_json(record)) + "\n")
            fields = {"quality_time_sec": now, "quality_met": result["met"], "quality_shortfall": result["shortfall"]}
            if result["met"] and self.reached is None:
                fields.update(time_to_quality_sec=now, framework=self.folder.framework, device=self.device)
            self.metrics.amend_last(to_json(fields))
        log.info(summary_line(epoch, now, result))
        if self.best is None or result["shortfall"] < self.best["shortfall"]:
            self.best = record
        if result["met"] and self.reached is None:
            self.reached = record
        self._met = bool(result["met"])
        return record

    def due(self, epoch: int) -> bool:
        """Whether an evaluation follows epoch ``epoch`` (0-based) and its checkpoint: every
        ``quality_every_epochs``, and at an epoch end past the budget (every process agrees)."""
        if not self.enabled:
            return False
        budget = self.cfg.quality_budget_sec
        self._over = bool(budget) and self.agree(self.elapsed() >= budget)
        self._met = None
        return (epoch + 1) % self.cfg.quality_every_epochs == 0 or self._over

    def stops(self, epoch: int) -> bool:
        """Whether the run stops after epoch ``epoch`` (0-based): the evaluation after it met the target
        (every process agrees on process 0's verdict), or the budget is spent."""
        if not self.enabled:
            return False
        if self._met is not None and self.agree(self._met):
            self.stopped = f"target met after epoch {epoch + 1}"
            return True
        if self._over:
            budget = self.cfg.quality_budget_sec
            self.stopped = f"budget of {budget:g} s spent after epoch {epoch + 1}"
            log.info("time to quality: the budget of %g s is spent; stopping after epoch %d", budget, epoch + 1)
        return self._over

    def finish(self) -> dict:
        """Log the outcome, write ``time_to_quality`` into ``run.json`` and return the fields the
        trainer adds to its result (``time_to_quality_sec``, ``quality_met``, ...); {} when off."""
        if not self.enabled:
            return {}
        best = self.best or {}
        reached = self.reached
        fields = {
            "time_to_quality_sec": None if reached is None else reached["time_sec"],
            "train_sec_to_quality": None if reached is None else reached["train_time_sec"],
            "quality_met": reached is not None,
            "quality_shortfall": best.get("shortfall"),
            "framework": self.folder.framework,
            "device": self.device,
        }
        summary = {
            **fields,
            "target": dataclasses.asdict(self.target),
            "evaluations": self.evaluations,
            "quality_eval_sec": self.eval_total,
            "stopped": self.stopped,
            "best": {k: v for k, v in best.items()},
        }
        if reached is not None:
            log.info(
                "time to quality: %.1f s (%.1f s without the evaluations), epoch %d, %s on %s",
                reached["time_sec"],
                reached["train_time_sec"],
                reached["epoch"],
                self.folder.framework,
                self.device,
            )
        elif best:
            log.info(
                "time to quality: target not met in %d evaluation(s) (%s); best shortfall %.3g after epoch %d",
                self.evaluations,
                self.stopped,
                best["shortfall"],
                best["epoch"],
            )
        if self.folder.main:
            info = read_run_info(self.folder.workdir)
            info["time_to_quality"] = to_json(summary)
            write_atomic(self.folder.workdir / "run.json", json.dumps(info, indent=1))
        return to_json(fields)
