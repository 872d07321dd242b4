"""Preemption, identical for TF and JAX: a stop signal (SLURM's SIGUSR1 warning, SIGTERM of a time limit
or ``scancel``) ends the epoch's steps at the next step boundary on every rank, the state is saved
there (synchronously: ``mid_epoch/``, its checkpoint numbered by global step) with the data cursor
(``cursor.json``), and the job is requeued where SLURM allows it; ``--resume`` (or the requeued job)
continues at that step (:mod:`shared_data.runtime.resume`).

The trainer checks :func:`stop_agreed` before each step and saves the state inside :func:`stopping`,
which then writes the cursor, requeues and raises the signal's
:class:`~shared_data.runtime.signals.Interrupted`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence

from shared_data.core.files import write_atomic
from shared_data.runtime import saves, signals
from shared_data.runtime.epoch_report import EpochReport
from shared_data.runtime.run_folder import RunFolder

log = logging.getLogger("dlas")


def stop_requested() -> bool:
    """Whether a stop signal arrived at this process since the steps began."""
    return signals.stop_requested() is not None


def waiting_signal(any_process: bool) -> int | None:
    """The signal a long pass outside the steps (validation, the quality check) stops for:
    ``any_process`` is the processes' agreement on :func:`shared_data.runtime.signals.pending`; this
    process's own signal, or SIGUSR1 recorded for another process's, so every process stops at the
    same step boundary; None where no process has one."""
    if not any_process:
        return None
    if signals.pending() is None:
        signals.request_stop(signals.signal.SIGUSR1)  # another process's signal
    return signals.pending()


def stop_agreed(any_process: bool) -> bool:
    """Whether the steps stop at this boundary: ``any_process`` is the agreement of every rank (True
    where any process's :func:`stop_requested` is; a one-integer collective across processes, the
    flag itself in one process), so all ranks end their steps at the same boundary. A rank that
    learns of another rank's signal records it as SIGUSR1."""
    if any_process and not stop_requested():
        signals.request_stop(signals.signal.SIGUSR1)  # another rank's signal
    return any_process


@contextlib.contextmanager
def stopping(folder: RunFolder, report: EpochReport, epoch: int, step: int, losses: Sequence[float]):
    """Around the save of the state at ``epoch``'s step ``step`` (0-based), where a stop signal ended the
    steps; yields the global step the save is numbered by. Signals wait until the block ends, memory
    too short for the save is one line (:func:`shared_data.runtime.saves.save_memory`); after it the
    main process writes the data cursor (``cursor.json``: epoch, step, global step, steps per epoch,
    the epoch's ``losses`` so far) and asks SLURM to requeue the job (:func:`requeue_job`). From the
    end of the save on, a further signal does not replace the stop (:func:`signals.exiting`).

    Raises:
        Interrupted: always, after the save, naming the step and the signal (exit 128 + signal).
    """
    signum = signals.stop_requested() or signals.signal.SIGUSR1
    global_step = epoch * folder.steps_per_epoch + step
    with signals.deferred():
        with saves.save_memory(folder, f"the state at epoch {epoch + 1}, step {step + 1}"):
            yield global_step
        if folder.main:
            cursor = dict(
                epoch=epoch,
                step=step,
                global_step=global_step,
                steps_per_epoch=folder.steps_per_epoch,
                losses=[float(x) for x in losses],
            )
            path = folder.mid_epoch_dir / "cursor.json"
            with report.writing(path):
                write_atomic(path, json.dumps(cursor) + "\n")
    signals.exiting(f"after its save at epoch {epoch + 1}, step {step + 1}, which stands")
    then = what_resumes(folder.main, requeue_job() if folder.main else False)
    raise signals.Interrupted(
        signum,
        f"at epoch {epoch + 1}, step {step + 1} of {folder.steps_per_epoch}: saved in {folder.mid_epoch_dir}; {then}",
    )


def what_resumes(main: bool, requeued: bool, env=None) -> str:
    """The end of a process's stop line after a step-boundary save: what continues the run. Process 0
    knows whether it requeued the SLURM job (``requeued``, :func:`requeue_job`); another process of a
    SLURM job (``SLURM_JOB_ID`` in ``env``, default ``os.environ``) does not, and says who decides."""
    if requeued:
        return "the job is requeued and resumes there"
    if not main and (os.environ if env is None else env).get("SLURM_JOB_ID"):
        return "process 0 requeues the job where SLURM allows it (sbatch --requeue), else --resume continues from there"
    return "--resume continues from there"


def requeue_job(env=None) -> bool:
    """Requeue this SLURM job (``scontrol requeue $SLURM_JOB_ID``) where it runs under SLURM and allows
    it (``scontrol show job`` says ``Requeue=1``: ``sbatch --requeue`` or the cluster's default);
    the requeued job (``SLURM_RESTART_COUNT`` set) resumes by itself
    (:func:`shared_data.runtime.cli.resume_requested`). Returns whether the job was requeued; a
    refusal is logged, never raised (the checkpoint is written already)."""
    import subprocess

    job = (os.environ if env is None else env).get("SLURM_JOB_ID")
    if not job:
        return False
    try:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=60)
        if shown.returncode:
            log.warning("scontrol show job %s failed: %s: not requeued", job, shown.stderr.strip()[:200])
            return False
        if "Requeue=1" not in shown.stdout:
            log.info("SLURM job %s does not allow requeue (sbatch --requeue): not requeued", job)
            return False
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("scontrol requeue %s failed (%s): not requeued", job, err)
        return False
    if done.returncode and "pending execution" in done.stderr:  # requeued already (scontrol requeue from outside)
        log.info("SLURM job %s is requeued already: it resumes from this step", job)
        return True
    if done.returncode:
        log.warning("scontrol requeue %s failed: %s", job, (done.stderr or done.stdout).strip()[:200])
        return False
    log.info("SLURM job %s requeued: it resumes from this step", job)
    return True
