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
  :func:`shared_data.inference.metrics.non_ml_channels`) in every one of those bins; the density's
  own ``quality_density_beat_non_ml`` where set (a gas whose density the non-ML baseline already
  predicts to within what a model reaches: the N-body's smallest scales).

The base thresholds (``quality_r_min``, ``quality_ratio_tol``, ``quality_k_max``) are the ones
chosen on the ``filtered`` gas; config ``quality_nonlinear`` holds the default data's own, per
channel, chosen from what time-to-quality curves on it reach.

The run ends where the verdict that meets it is known (the prediction runs at an epoch's end, its
scoring while the next epoch trains: :mod:`shared_data.inference.quality_check`; the steps after the
epoch judged are dropped), or at the first epoch end past ``quality_budget_sec`` seconds from the start
(the model then at hand is evaluated too), or after ``num_epochs``. Records, in the run folder (main
process):

* ``quality.jsonl``: one JSON line per evaluation, the curve against time: ``epoch``, ``step``,
  ``time_sec`` (start of the run to the moment its verdict is known), ``train_time_sec`` (the same
  without the evaluations' seconds on the training path), ``eval_sec`` (the prediction, on the
  training path), ``score_sec`` (the spectra and the verdict, on a host thread), ``target`` (the one
  judged), ``met``, ``shortfall`` (below) and per channel the binned ``k``, ``r``, ``ratio``,
  ``r_baseline``, ``r_non_ml`` and their worst values;
* ``metrics.jsonl``: the evaluated epoch's record gets ``quality_time_sec``, ``quality_met`` and
  ``quality_shortfall``, and the one that met the target ``time_to_quality_sec``, ``framework``, ``device``;
* ``run.json``: ``time_to_quality`` with ``time_to_quality_sec`` (the ``time_sec`` of the evaluation
  that met the target; null when none did), its ``definition`` in words, ``train_sec_to_quality``,
  ``framework``, ``device``, the target, the number of evaluations, the reason the run stopped,
  ``volume`` (the validation volume's path and per-channel Nbody CRC-32s, which identify it wherever
  it is moved) and ``best``: the evaluation with the smallest shortfall (the target's result when met, the best
  reached otherwise).

The clock starts when the trainer opens its :class:`shared_data.runtime.run_folder.RunFolder` (after the framework
has been imported), so ``time_to_quality_sec`` counts everything after that as MLPerf does: reading the
data, compiling, training, the per-epoch validation loss, checkpoints and the quality evaluations.
``train_sec_to_quality`` leaves the evaluations' predictions out (the price of measuring, not of
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
from pathlib import Path

import numpy as np

from shared_data.core.config import Config
from shared_data.core.errors import UserError, quoted
from shared_data.inference.units import DENSITY, TEMPERATURE

log = logging.getLogger("dlas")

CHANNELS = (DENSITY, TEMPERATURE)
RECORD = "quality.jsonl"


@dataclasses.dataclass(frozen=True)
class Target:
    """The physics target (config keys ``quality_*``): r(k) >= ``r_min`` and |P ratio - 1| <= ``ratio_tol``
    in every bin up to ``k_max`` h/Mpc for gas density and temperature, with ``beat_baseline`` the
    temperature's r(k) at least the dark-matter baseline's, and with ``beat_non_ml`` both channels'
    r(k) at least the non-ML baseline's. ``temperature_r_min`` and ``temperature_ratio_tol``, where
    not None, replace ``r_min`` and ``ratio_tol`` for the temperature (:meth:`thresholds`);
    ``density_beat_non_ml``, where not None, replaces ``beat_non_ml`` for the density
    (:meth:`beats_non_ml`)."""

    r_min: float
    ratio_tol: float
    k_max: float
    beat_baseline: bool
    beat_non_ml: bool = False
    temperature_r_min: float | None = None
    temperature_ratio_tol: float | None = None
    density_beat_non_ml: bool | None = None

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
            cfg.quality_density_beat_non_ml,
        )

    def thresholds(self, name: str) -> tuple[float, float]:
        """(r_min, ratio_tol) of channel ``name``: the temperature's own where set, else the shared ones."""
        if name == TEMPERATURE:
            return (
                self.r_min if self.temperature_r_min is None else self.temperature_r_min,
                self.ratio_tol if self.temperature_ratio_tol is None else self.temperature_ratio_tol,
            )
        return self.r_min, self.ratio_tol

    def beats_non_ml(self, name: str) -> bool:
        """Whether channel ``name``'s r(k) must be at least the non-ML baseline's: the density's own
        ``density_beat_non_ml`` where set, else ``beat_non_ml``."""
        if name == DENSITY and self.density_beat_non_ml is not None:
            return self.density_beat_non_ml
        return self.beat_non_ml

    def needs_non_ml(self) -> bool:
        """Whether any channel is tested against the non-ML baseline (which needs the volume's
        ``k_jeans_h_mpc`` and ``igm_gamma`` attributes)."""
        return any(self.beats_non_ml(name) for name in CHANNELS)

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
        non_ml = [name for name in CHANNELS if self.beats_non_ml(name)]
        which = "" if len(non_ml) != 1 else {DENSITY: "density ", TEMPERATURE: "temperature "}[non_ml[0]]
        non_ml_text = f", {which}r >= the non-ML baseline's" if non_ml else ""
        return text + (", temperature r >= the baseline's" if self.beat_baseline else "") + non_ml_text


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
            a channel is tested against the non-ML baseline and the metrics have none (the volume lacks
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
        if target.beats_non_ml(name):
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


def read_evaluations(workdir) -> list[dict]:
    """The evaluations of ``<workdir>/quality.jsonl`` for a reader of the whole curve (a study's table
    or plot), oldest first: a torn last line (what a killed trainer leaves) is skipped with a warning
    naming the file, as :func:`read_records` skips it; any other line that is not an evaluation record
    (:func:`evaluation_problem`) is an error.

    Raises:
        UserError: the file cannot be read or is not text, or a line that is not the last one does not
            parse, or a record lacks a field or holds one of the wrong type (file, line and field named).
    """
    path = Path(workdir) / RECORD
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise UserError(f"{path} is not text (a binary or damaged file), expected JSON lines") from None
    except OSError as err:
        raise UserError(f"{path} cannot be read ({err.strerror})") from None
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
    records = []
    for i, line in numbered:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if i == numbered[-1][0]:
                log.warning("%s line %d is not a whole JSON record (a torn write): skipped", path, i)
                continue
            raise UserError(f"{path} line {i} is not JSON ({err.msg}), expected an evaluation record") from None
        problem = evaluation_problem(record)
        if problem:
            raise UserError(f"{path} line {i}: {problem}")
        records.append(record)
    return records


def _is_number(x, finite: bool = False) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and (not finite or math.isfinite(x))


def _numbers(values, length: int | None = None) -> bool:
    """A list of numbers or nulls (a non-finite value is written as null), of ``length`` where given."""
    return (
        isinstance(values, list)
        and (length is None or len(values) == length)
        and all(v is None or _is_number(v) for v in values)
    )


#: The fields of a channel's entry that are numbers or null where present.
_CHANNEL_NUMBERS = ("r_worst", "ratio_dev_worst", "r_minus_baseline_worst", "r_minus_non_ml_worst", "shortfall")


def evaluation_problem(record) -> str | None:
    """What makes ``record`` (a parsed line of ``quality.jsonl``) unfit for a reader of the curve, or
    None: it needs ``epoch`` (an integer >= 0), ``time_sec`` (a finite number >= 0) and ``channels``
    with both gas channels, each with ``k`` (numbers) and ``r`` and ``ratio`` (numbers or null, one
    per bin); the other fields the trainer writes are checked where present (numbers or null,
    ``met`` a boolean, ``target`` an object, ``r_baseline`` and ``r_non_ml`` null or one per bin)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, expected an evaluation record (an object)"
    for key in ("epoch", "time_sec", "channels"):
        if key not in record:
            return f"the record has no {key!r}"
    epoch = record["epoch"]
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        return f"epoch is {quoted(epoch, 60)}, expected an integer >= 0"
    where = f"the evaluation of epoch {epoch}"
    for key in ("time_sec", "train_time_sec", "eval_sec", "score_sec"):
        if key in record and not (_is_number(record[key], finite=True) and record[key] >= 0):
            return f"{where}: {key} is {quoted(record[key], 60)}, expected a finite number of seconds >= 0"
    if "shortfall" in record and not (record["shortfall"] is None or _is_number(record["shortfall"])):
        return f"{where}: shortfall is {quoted(record['shortfall'], 60)}, expected a number or null"
    if "met" in record and not isinstance(record["met"], bool):
        return f"{where}: met is {quoted(record['met'], 60)}, expected true or false"
    if record.get("target") is not None and not isinstance(record["target"], dict):
        return f"{where}: target is {quoted(record['target'], 60)}, expected an object"
    channels = record["channels"]
    if not isinstance(channels, dict):
        return f"{where}: channels is {quoted(channels, 60)}, expected an object of {', '.join(CHANNELS)}"
    for name in CHANNELS:
        c = channels.get(name)
        if not isinstance(c, dict):
            return f"{where}: channels has no {name!r} entry (an object)"
        k = c.get("k")
        if not (isinstance(k, list) and all(_is_number(v, finite=True) for v in k)):
            return f"{where}: {name}'s k is {quoted(k, 60)}, expected a list of numbers (h/Mpc)"
        for key in ("r", "ratio"):
            if not _numbers(c.get(key), len(k)):
                return f"{where}: {name}'s {key} is {quoted(c.get(key), 60)}, expected {len(k)} numbers (one per k bin)"
        for key in ("r_baseline", "r_non_ml"):
            if c.get(key) is not None and not _numbers(c[key], len(k)):
                what = quoted(c[key], 60)
                return f"{where}: {name}'s {key} is {what}, expected null or {len(k)} numbers (one per k bin)"
        for key in _CHANNEL_NUMBERS:
            if c.get(key) is not None and not _is_number(c[key]):
                return f"{where}: {name}'s {key} is {quoted(c[key], 60)}, expected a number or null"
    return None


def restored(record: dict) -> dict | None:
    """A kept evaluation record for the resumed clock: its times as floats and a null shortfall (a
    non-finite one, written as null) as inf; None when a time is missing, not a number, not finite or
    negative."""
    times = [record.get(k) for k in ("time_sec", "train_time_sec")]
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0 for t in times):
        return None
    shortfall = record.get("shortfall")
    shortfall = math.inf if not isinstance(shortfall, (int, float)) else float(shortfall)
    return {**record, "time_sec": float(times[0]), "train_time_sec": float(times[1]), "shortfall": shortfall}


def judged_against(record: dict, target: Target) -> bool:
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
