"""The epoch report, identical for TF and JAX: the tutorial's per-epoch log lines, the input-wait share
(and once per run a sentence when the run is input-bound), ``metrics.jsonl``, ``run.json``'s record
of the invocation, TensorBoard scalars under the tutorial's tags, the divergence check and the peak
memory line.

The trainer calls :meth:`EpochReport.begin` once its steps are compiled, then per epoch
:meth:`EpochReport.check_finite` (before validating), :meth:`EpochReport.validating` around the
validation pass, :meth:`EpochReport.epoch`, :meth:`EpochReport.on_path` around the checkpoint and the
quality check and :meth:`EpochReport.parts` (the epoch's wall time in parts); :meth:`EpochReport.finish`
at the end. Only the main
process writes files.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import numpy as np

from shared_data.core.config import config_dict
from shared_data.core.errors import UserError
from shared_data.runtime import checks, signals
from shared_data.runtime.logs import INPUT_BOUND_SHARE, epoch_lines, input_bound_advice, log_file_error, share_line
from shared_data.runtime.records import TENSORBOARD_TAGS, MetricsLog, ScalarWriter, record_invocation
from shared_data.runtime.run_folder import RunFolder
from shared_data.runtime.steps import EpochTiming

log = logging.getLogger("dlas")


class EpochReport:
    """What a run prints and records per epoch, in ``folder`` (a :class:`RunFolder`); ``compile_sec`` is
    the train step's compile time (in every epoch's record)."""

    def __init__(self, folder: RunFolder, compile_sec: float):
        self.folder, self.cfg, self.compile_sec = folder, folder.cfg, compile_sec
        self.metrics = MetricsLog(folder.workdir, enabled=folder.main)
        self.writer: ScalarWriter | None = None
        self.last: dict = {}
        self.val_sec = 0.0
        self._parts: dict[str, float] = {}  # an epoch end's parts on the training path (on_path)
        self._said_input_bound = False

    def begin(self, start_epoch: int, versions: dict) -> bool:
        """Record the invocation in ``run.json``, drop metrics after ``start_epoch`` and open TensorBoard
        (with the config as hparams in a fresh run); return whether TensorBoard starts with the step-0
        validation loss (a fresh run that writes it: :meth:`step0`)."""
        signals.reclaim()  # the steps are compiled and the input pipelines started (DALI's included)
        self.last = {"epoch": start_epoch, "compile_sec": self.compile_sec}
        if not self.folder.main:
            return False
        workdir = self.folder.workdir
        with self.writing(self.metrics.path):
            self.metrics.truncate_after(start_epoch)
        with self.writing(workdir / "run.json"):
            record_invocation(workdir, self.cfg, self.folder.framework, start_epoch, versions)
        failed = log_file_error()
        if failed:  # out.log cannot be written: stop before the first step
            raise self.write_error(*failed)
        with self.writing(workdir / "tb"):
            self.writer = ScalarWriter(workdir / "tb", self.cfg.tensorboard)
        if start_epoch or self.writer._writer is None:
            return False
        folder = self.folder
        hparams = {"framework": folder.framework, **config_dict(self.cfg), "global_batch": folder.global_batch}
        self.writer.hparams(hparams, TENSORBOARD_TAGS)
        return True

    def step0(self, val_loss: float) -> None:
        """TensorBoard's step-0 scalars: the untrained model's validation loss and the first LR."""
        self.writer.scalars(0, {"Loss/valid": val_loss, "Learning Rate": float(self.folder.lr_table[0])})

    def check_finite(self, epoch: int, train_losses) -> None:
        """Stop a run whose training loss turned non-finite in epoch ``epoch`` (without fp16 loss scaling,
        which skips such steps); ``train_losses`` are the epoch's per-step losses on the host.

        Raises:
            UserError: the step and config; the file and crop when the step's batch is the cause
                (:func:`shared_data.runtime.checks.batch_problem`), else what to lower or enable.
        """
        losses = np.asarray(train_losses, np.float64)
        cfg, steps = self.cfg, self.folder.steps_per_epoch
        if np.isfinite(losses).all() or cfg.precision == "float16":
            return
        bad = int(np.argmax(~np.isfinite(losses)))
        where = f"training diverged: loss is {losses[bad]} at step {epoch * steps + bad} of config {cfg.name!r}"
        cause = checks.batch_problem(cfg, epoch, bad, self.folder.global_batch // self.folder.local_batch)
        if cause:
            raise UserError(f"{where} because of its data: {cause}")
        checked = "; its crops are finite and within range, so" if cause is not None else ";"
        raise UserError(f"{where}{checked} lower start_lr or enable loss scaling")

    @contextlib.contextmanager
    def validating(self):
        """Around an epoch's validation pass: its seconds for the epoch's lines; a signal during it
        stops the run with the signal's line, not the loader's error it caused."""
        t0 = time.perf_counter()
        with signals.signal_first():
            yield
        self.val_sec = time.perf_counter() - t0

    @contextlib.contextmanager
    def on_path(self, part: str):
        """Around a part of an epoch's end on the training path after its lines (``part``: "checkpoint",
        "quality check"): its seconds for :meth:`parts`."""
        t0 = time.perf_counter()
        yield
        self._parts[part] = time.perf_counter() - t0

    def parts(self, epoch: int, timing: EpochTiming) -> dict:
        """Log epoch ``epoch``'s (0-based) wall time, from its first step to now, and its parts: the steps
        (``timing``), the validation, what :meth:`on_path` timed and the rest; add them to the epoch's
        record (``wall_sec``, ``checkpoint_sec``, ``quality_check_sec``, ``other_sec``) and return them."""
        wall = time.perf_counter() - timing.start
        on_path, self._parts = self._parts, {}
        parts = {"steps": timing.seconds, "validation": self.val_sec, **on_path}
        parts["other"] = max(wall - sum(parts.values()), 0.0)
        # the steps and the validation are in the record already (epoch_sec, val_sec)
        fields = {"wall_sec": wall, **{f"{k.replace(' ', '_')}_sec": parts[k] for k in [*on_path, "other"]}}
        self.last.update(fields)
        if self.folder.main:
            text = " + ".join(f"{name} {sec:.2f} s" for name, sec in parts.items())
            log.info("epoch %d on the training path: %.2f s = %s", epoch + 1, wall, text)
            with self.writing(self.metrics.path):
                self.metrics.amend(epoch + 1, fields)
        return parts

    def epoch(self, epoch: int, timing: EpochTiming, train_losses, val_loss: float, step: int, loss_scale=None) -> dict:
        """Close epoch ``epoch`` (0-based): log the tutorial's lines, record and return the epoch's metrics
        (``train_losses`` its per-step losses on the host, ``timing`` its steps' clock, ``val_loss`` the
        validation loss, ``step`` the optimizer steps done, ``loss_scale`` fp16's). A NaN validation loss
        while a stop waits is a pass the stop cut short: the line says it was not measured, the record
        names the signal (``val_cut_short_by``) and TensorBoard gets no validation point.

        Raises:
            UserError: ``metrics.jsonl`` or ``out.log`` cannot be written (a full disk: :meth:`write_error`).
        """
        losses = np.asarray(train_losses, np.float64)
        seconds = timing.seconds
        train_loss = float(np.mean(losses[np.isfinite(losses)])) if np.isfinite(losses).any() else float("nan")
        input_share = min(timing.input_seconds / seconds, 1.0)
        samples = timing.trained_steps * self.folder.global_batch
        # a NaN from a validation pass that a stop cut short (the trainers' evaluate) is no measurement
        cut = signals.pending() if np.isnan(val_loss) else None
        cut_by = signals.signal.Signals(cut).name if cut else None
        for line in epoch_lines(epoch + 1, seconds, samples, train_loss, val_loss, self.val_sec, cut_by):
            log.info(line)
        log.info(share_line(input_share, 1.0 - input_share))
        self._advise(epoch, input_share)
        lr = float(self.folder.lr_table[min(step, len(self.folder.lr_table)) - 1])
        self.last = dict(
            epoch=epoch + 1,
            step=step,
            train_loss=train_loss,
            val_loss=val_loss,
            lr=lr,
            samples_per_sec=samples / seconds,
            epoch_sec=seconds,
            val_sec=self.val_sec,
            compile_sec=self.compile_sec,
            input_wait_share=input_share,
        )
        if cut_by:
            self.last["val_cut_short_by"] = cut_by
        if loss_scale is not None:
            self.last["loss_scale"] = float(loss_scale)
        failed = log_file_error()
        if failed:
            raise self.write_error(*failed)
        with self.writing(self.metrics.path):
            self.metrics.append(self.last)
        if self.writer is not None:
            steps = self.folder.steps_per_epoch
            if step == steps * (epoch + 1) and epoch == 0:  # a fresh run: the first step's loss is the step-0 loss
                self.writer.scalars(0, {"Loss/train": float(losses[0])})
            rate = {"Avg iters per sec": steps / seconds}
            val = {} if cut_by else {"Loss/valid": val_loss}
            self.writer.scalars(step, {"Loss/train": train_loss, **val, "Learning Rate": lr, **rate})
        return self.last

    def _advise(self, epoch: int, input_share: float) -> None:
        """Say once per run that it is input-bound, from the second epoch on (the first one includes
        the loaders' start-up) or in a one-epoch run."""
        if self._said_input_bound or input_share < INPUT_BOUND_SHARE:
            return
        if epoch == 0 and self.cfg.num_epochs > 1:
            return
        self._said_input_bound = True
        log.info(
            "This run is input-bound: the host waited for input %.0f%% of epoch %d, so the %s loader, not "
            "the step, sets the speed (the tutorial's first finding). What would fix it: %s.",
            100 * input_share,
            epoch + 1,
            self.cfg.data_loader_config,
            input_bound_advice(self.cfg.data_loader_config),
        )

    def finish(self, peak_memory_bytes: int | None) -> dict:
        """The end of a run that finished: log the peak device memory, close TensorBoard and the run
        folder (``out.log``, its lock) and return the last epoch's metrics (``epoch``, ``train_loss``,
        ``val_loss``, ``samples_per_sec``, ``compile_sec``, ...)."""
        if peak_memory_bytes:
            log.info("peak device memory: %.2f GiB", peak_memory_bytes / 2**30)
            self.last["peak_memory_bytes"] = peak_memory_bytes
        if self.writer is not None:
            self.writer.close()
        self.folder.close()
        return dict(self.last)

    def write_error(self, path: Path, err: OSError) -> UserError:
        """The one line for a run record (``out.log``, ``metrics.jsonl``, ``run.json``) that cannot be
        written: the file, the reason, the epoch not checkpointed and the checkpoint kept."""
        reason = err.strerror or " ".join(str(err).split())[:200]
        position = self.folder.position
        return UserError(f"cannot write {path} ({reason}){position.lost()}; {position.kept()}")

    @contextlib.contextmanager
    def writing(self, path: Path):
        """Turn an ``OSError`` of a record's write (a full disk) into :meth:`write_error`."""
        try:
            yield
        except OSError as err:
            raise self.write_error(path, err) from None
