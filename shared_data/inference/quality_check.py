"""The time-to-quality mode of a training run, identical for TF and JAX: the quality check of the whole
validation volume after every ``quality_every_epochs``-th epoch, overlapped with training.

The check has two parts. The prediction of the volume runs at the epoch boundary, on the training path,
with the weights it judges (:meth:`Monitor.evaluate`; the device is the trainer's). The spectra and
the verdict (:func:`shared_data.inference.metrics.compute_metrics`, :func:`shared_data.inference.quality.check`:
NumPy FFTs on the host) run on a host thread while the next epoch trains. The trainer polls for the
verdict before each step (:meth:`Monitor.target_met`); the verdict that meets the target ends the run at
that step: the steps trained after the epoch it judged are dropped, and the run ends with that epoch's
checkpoint and weights (:meth:`Monitor.judged_epoch`), the model that met the target.

The time to quality is the wall time, from the start of the run, at which the verdict that met the
target was known (``time_sec`` of its record), never the end of the epoch it judged.
``train_time_sec`` leaves out the evaluations' seconds on the training path (the predictions); the
scoring in the background costs the training path nothing but the host's share.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from shared_data.core.config import Config
from shared_data.core.errors import ConfigError, UserError
from shared_data.core.files import write_atomic
from shared_data.data import dataset
from shared_data.inference import predict as predict_mod
from shared_data.inference import tiling
from shared_data.inference.metrics import compute_metrics, to_json
from shared_data.inference.quality import RECORD, Target, check, judged_against, read_records, restored, summary_line
from shared_data.inference.units import QUANTITIES, read_volume, units_from_files
from shared_data.model import unet_spec
from shared_data.runtime import preemption, signals
from shared_data.runtime.records import read_run_info

log = logging.getLogger("dlas")

TIME_TO_QUALITY = (
    "the wall time from the start of the run to the moment the verdict that met the target was known "
    "(the volume predicted at an epoch's end, its spectra scored while the next epoch trained)"
)


class Monitor:
    """The time-to-quality mode of a trainer's run in ``folder`` (a
    :class:`shared_data.runtime.run_folder.RunFolder`; off when ``quality_every_epochs`` is 0: every
    method then does nothing). ``metrics`` is the run's ``metrics.jsonl``
    (:class:`shared_data.runtime.records.MetricsLog`), whose epoch records gain the verdicts.

    The trainer loops over the :meth:`remaining` epochs; before each step and after each epoch's steps
    it asks :meth:`target_met` (the verdict in flight); after each epoch's checkpoint it predicts when
    :meth:`due` (:meth:`evaluate`) and stops when :meth:`stops` (the budget); then :meth:`finish`.
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
        self.agree = agree  # process 0's decision on every process, so all stop at the same step
        self.enabled = folder.cfg.quality_every_epochs > 0
        self.predict_cfg = predict_mod.prediction_config(folder.cfg, "float32")
        self.target = Target.from_config(folder.cfg)
        self.evaluations, self.best, self.reached = 0, None, None
        self.eval_total, self.stopped, self.clock_offset = 0.0, "num_epochs trained", 0.0
        self._over = False  # after an epoch: the budget is spent
        self._scoring: Future | None = None  # the verdict in flight
        self._met_here: int | None = None  # the epoch whose verdict met the target in this invocation
        self._pool: ThreadPoolExecutor | None = None
        if not self.enabled:
            return
        # A fresh or resumed run keeps the curve up to the epoch it starts from (process 0 rewrites the file
        # once the checks below have passed); a resumed one continues its clock from the last evaluation
        # kept and keeps the verdicts of those judged against this target.
        keep = [r for r in read_records(folder.workdir) if r["epoch"] <= start_epoch] if start_epoch else []
        self._restore(keep, start_epoch)
        self._read_volume(folder.cfg)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quality-check")
        if folder.main:
            write_atomic(folder.workdir / RECORD, "".join(json.dumps(r) + "\n" for r in keep))
        log.info(
            "time to quality: the whole %s (%d^3) every %d epoch(s); target %s%s",
            folder.cfg.data_file("val").name,
            self.truth.shape[1],
            folder.cfg.quality_every_epochs,
            self.target.describe(),
            f"; budget {folder.cfg.quality_budget_sec:g} s" if folder.cfg.quality_budget_sec else "",
        )

    def _read_volume(self, cfg: Config) -> None:
        """The validation volume, its units and the prediction's windows; the checks of the class's
        ConfigError."""
        path = cfg.data_file("val")
        self.truth, attrs = read_volume(path, "Hydro")
        self.nbody, nbody_attrs = read_volume(path, "Nbody")
        # what identifies the volume wherever it is moved: a study's reader checks its --val against it
        if nbody_attrs.get("Nbody_crc32") is not None:
            crc32 = dataset.json_attr(nbody_attrs, "Nbody_crc32", path)
        else:
            crc32 = dataset.channel_crc32(self.nbody)
        self.volume = {"path": str(path.absolute()), "Nbody_crc32": crc32}
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
        if self.target.needs_non_ml() and missing:
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

    def _restore(self, keep: list[dict], start_epoch: int) -> None:
        """The clock, evaluation count, best and reached evaluation of a resumed run from the records
        it keeps (:func:`shared_data.inference.quality.restored`); the best and reached ones only
        among the evaluations judged against this target (each record holds its ``target``).

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
        kept = [restored(r) for r in keep]
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
        same = [r for r in kept if judged_against(r, self.target)]
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

    def evaluate(self, epoch: int, step: int, apply: tiling.Apply) -> float:
        """Predict the volume with ``apply`` (NDHWC float32 windows -> outputs) after ``epoch`` epochs
        (``step`` optimizer steps), here on the training path, then score it on the host thread while
        the next epoch trains (:meth:`target_met` collects the verdict). Returns the seconds on the
        training path (the prediction)."""
        self._collect()  # the previous verdict, if the trainer has not asked for it yet
        t0 = time.perf_counter()
        side = self.truth.shape[1]
        hydro, _ = tiling.predict_volume(self.x, apply, self.cfg.N_out_channels, self.window, self.overlap, self.align)
        pred = np.ascontiguousarray(np.moveaxis(hydro[:side, :side, :side], -1, 0))
        seconds = time.perf_counter() - t0
        self.eval_total += seconds
        self.evaluations += 1
        self._scoring = self._pool.submit(self._score, epoch, step, pred, seconds, self.eval_total)
        return seconds

    def _score(self, epoch: int, step: int, pred: np.ndarray, eval_sec: float, eval_total: float) -> dict:
        """The record of one evaluation (on the host thread): the spectra, the verdict and the clock at
        which it is known."""
        t0 = time.perf_counter()
        result = check(compute_metrics(pred, self.truth, self.nbody, self.units), self.target)
        now = self.elapsed()
        return {
            "epoch": epoch,
            "step": step,
            "time_sec": now,
            "train_time_sec": now - eval_total,
            "eval_sec": eval_sec,
            "score_sec": time.perf_counter() - t0,
            "target": dataclasses.asdict(self.target),
            **result,
        }

    def _collect(self) -> dict | None:
        """Wait for the verdict in flight, record and log it; its record, or None when none was in flight.
        Raises what the scoring raised."""
        if self._scoring is None:
            return None
        future, self._scoring = self._scoring, None
        record = future.result()
        if self.folder.main:
            with open(self.folder.workdir / RECORD, "a") as fh:
                fh.write(json.dumps(to_json(record)) + "\n")
            fields = {
                "quality_time_sec": record["time_sec"],
                "quality_met": record["met"],
                "quality_shortfall": record["shortfall"],
            }
            if record["met"] and self.reached is None:
                fields.update(
                    time_to_quality_sec=record["time_sec"], framework=self.folder.framework, device=self.device
                )
            self.metrics.amend(record["epoch"], to_json(fields))
        log.info(summary_line(record["epoch"], record["time_sec"], record))
        if self.best is None or record["shortfall"] < self.best["shortfall"]:
            self.best = record
        if record["met"] and self.reached is None:
            self.reached = record
        return record

    def target_met(self, wait: bool = False) -> bool:
        """Whether the run ends here: the verdict in flight is known (``wait``: wait for it; else only
        where process 0 has it already, a broadcast while one is in flight) and met the target (process
        0's verdict on every process). Once True, it stays True: the steps after the epoch judged
        are dropped and the run ends with that epoch (:meth:`judged_epoch`)."""
        if self._met_here is not None:
            return True
        if self._scoring is None or not (wait or self.agree(self._scoring.done())):
            return False
        record = self._collect()
        if self.agree(bool(record["met"])):
            self._met_here = record["epoch"]
            self.stopped = f"target met after epoch {record['epoch']}"
            log.info(
                "time to quality: the verdict on epoch %d met the target %.1f s from the start; the run ends with "
                "the model of epoch %d",
                record["epoch"],
                record["time_sec"],
                record["epoch"],
            )
        return self._met_here is not None

    def judged_epoch(self) -> int | None:
        """The epoch (epochs done) whose checkpoint the run ends with where a verdict met the target in
        this invocation (the trainer restores it when it trained past it); None otherwise."""
        return self._met_here

    def due(self, epoch: int) -> bool:
        """Whether an evaluation follows epoch ``epoch`` (0-based) and its checkpoint: every
        ``quality_every_epochs``, and at an epoch end past the budget (every process agrees); never
        while a stop signal waits for the next step boundary (process 0's, which every process
        follows): that epoch is not evaluated, and the run stops at the next step boundary."""
        if not self.enabled:
            return False
        waiting = preemption.waiting_signal(self.agree(signals.pending() is not None))
        if signals.cut_short(waiting, f"the quality check of epoch {epoch + 1}"):
            return False
        budget = self.cfg.quality_budget_sec
        self._over = bool(budget) and self.agree(self.elapsed() >= budget)
        return (epoch + 1) % self.cfg.quality_every_epochs == 0 or self._over

    def stops(self, epoch: int) -> bool:
        """Whether the run stops after epoch ``epoch`` (0-based) because the budget is spent (every
        process agrees); the last evaluation's verdict is then waited for by :meth:`finish`."""
        if not self.enabled or not self._over:
            return False
        budget = self.cfg.quality_budget_sec
        self.stopped = f"budget of {budget:g} s spent after epoch {epoch + 1}"
        log.info("time to quality: the budget of %g s is spent; stopping after epoch %d", budget, epoch + 1)
        return True

    def close(self) -> None:
        """Stop the host thread. A verdict in flight that nobody collects (a run that stops on a signal
        or an error) is not recorded: a resumed run has no evaluation of that epoch."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def finish(self) -> dict:
        """Wait for the last verdict, log the outcome, write ``time_to_quality`` into ``run.json`` and
        return the fields the trainer adds to its result (``time_to_quality_sec``, ``quality_met``, ...);
        {} when off."""
        if not self.enabled:
            return {}
        last = self._collect()
        if last is not None and last["met"] and self.reached is last:
            self.stopped = f"target met after epoch {last['epoch']}"
        self.close()
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
            "definition": TIME_TO_QUALITY,
            "target": dataclasses.asdict(self.target),
            "evaluations": self.evaluations,
            "quality_eval_sec": self.eval_total,
            "stopped": self.stopped,
            "volume": self.volume,
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
