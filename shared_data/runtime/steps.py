"""An epoch's steps as the trainer loops over them, identical for TF and JAX: the step numbers (with the
progress bar, a line every :data:`PROGRESS_SEC` of slow steps, and the run's position for a signal's
line), and the epoch's clock with its input wait (:class:`EpochTiming`).

The input wait is the tutorial's data-wait timer. On a GPU the host's plain wait in ``next(batches)``
also holds the time it is blocked behind steps already queued on the device, which is not input
time; so the trainer drains the device before the sampled steps (:data:`WAIT_SAMPLES` an epoch,
evenly spaced: each drain costs the step's overlap with its input) and times only the wait for the
batch itself, until the batch is computed. The epoch's input time is their mean times its steps.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from shared_data.runtime import signals
from shared_data.runtime.logs import progress
from shared_data.runtime.run_folder import RunFolder

log = logging.getLogger("dlas")

#: Seconds without a log line after which :func:`epoch_steps` says which step of the epoch it is at.
PROGRESS_SEC = 30.0
#: Steps of an epoch whose input wait is measured (at most this many, evenly spaced): each one drains
#: the device first, so few keep the step's overlap with its input.
WAIT_SAMPLES = 32


def epoch_steps(folder: RunFolder, epoch: int, first: int = 0) -> Iterator[int]:
    """The step numbers of ``epoch`` (0-based within the epoch) from ``first`` (a run resumed
    mid-epoch): the progress bar advances with them, slow steps get a line every
    :data:`PROGRESS_SEC` seconds, the run's position follows them, and a signal held since the last
    step (:func:`shared_data.runtime.signals.raise_pending`) is raised before each."""
    n, position = folder.steps_per_epoch, folder.position
    position.start_epoch(epoch)
    started = said = time.perf_counter()
    for i in progress(range(first, n), n - first, f"epoch {epoch + 1}", folder.cfg.progress_bar):
        now = time.perf_counter()
        if i > first and now - said >= PROGRESS_SEC and folder.main:  # slow steps: not minutes of silence
            log.info("epoch %d: step %d/%d, %.1f s per step", epoch + 1, i, n, (now - started) / (i - first))
            said = now
        position.at_step(i)
        signals.raise_pending()
        yield i


class EpochTiming:
    """The clock of one epoch's steps (from construction to :meth:`stop`) and its input wait, measured
    on at most :data:`WAIT_SAMPLES` evenly spaced steps of the ``steps_per_epoch`` (the trainer drains
    the device before each sampled step: :meth:`sampled`), scaled to the ``steps_per_epoch - first``
    steps this invocation trains (``first``: the first step, a run resumed mid-epoch)."""

    def __init__(self, steps_per_epoch: int, first: int = 0):
        self.start, self.first = time.perf_counter(), first
        n = steps_per_epoch
        self.trained_steps = (n - first) or n
        stride = max(1, -(-n // WAIT_SAMPLES))  # ceil: at most WAIT_SAMPLES sampled steps
        self._sampled = range(stride // 2, n, stride)
        self._waited, self._timed = 0.0, 0
        self.input_seconds = 0.0  # the epoch's input time, from the steps timed so far
        self.seconds = 0.0

    def sampled(self, step: int) -> bool:
        """Whether the input wait of ``step`` is measured (drain the device before it)."""
        return step in self._sampled

    @contextlib.contextmanager
    def input_wait(self, timed: bool):
        """Around the wait for a batch: timed when ``timed``."""
        t0 = time.perf_counter()
        yield
        if timed:
            self._waited, self._timed = self._waited + time.perf_counter() - t0, self._timed + 1
            self.input_seconds = self._waited * self.trained_steps / self._timed

    def stop(self) -> float:
        """The end of the epoch's steps (its work computed): returns and keeps :attr:`seconds`."""
        self.seconds = time.perf_counter() - self.start
        return self.seconds
