"""What a run prints: the console and ``out.log`` handlers, the progress bar, the tutorial's per-epoch
lines and the input-bound advice, identical for TF and JAX.

Process 0 logs at INFO; every other process logs warnings and errors only, each line tagged with its
rank. The epoch lines are the tutorial's, followed by the share of the epoch the host waited for input::

      Time taken for epoch 1 is 12.3 sec, avg 166.4 samples/sec
        Avg train loss=0.051234
        Avg val loss=0.049876
        Total validation time: 0.8 sec
        Input wait 3.2% of the epoch, train step 96.5%
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import BinaryIO

from shared_data.core import loader_kinds

log = logging.getLogger("dlas")

#: Lines of this logger print at INFO on every rank (each rank says where it stands in the run).
RANK_LOGGER = "dlas.rank"

#: Dates and times in every line: a batch job runs for days.
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


#: A run is called input-bound when the host waits for input this share of an epoch or more.
INPUT_BOUND_SHARE = 0.3


def setup_logging(process_index: int = 0, level: int = logging.INFO) -> None:
    """One stream handler on stdout (idempotent). Process 0 logs at ``level``; every other process
    logs warnings, errors and :data:`RANK_LOGGER`'s lines only, each line tagged with its rank."""
    root = logging.getLogger()
    for h in _handlers("stream"):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_formatter(process_index))
    handler._dlas = "stream"  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level if process_index == 0 else logging.WARNING)
    for noisy in ("absl", "jax._src", "orbax", "tensorflow", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger(RANK_LOGGER).setLevel(logging.INFO)


#: A C++ log line of absl or TensorFlow (``I0000 00:00:...``, severity I, W, E, F), or absl's notice
#: that it writes to stderr before it is initialised.
_NATIVE_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


#: Error lines TensorFlow prints where nothing is wrong. On every hit of its persistent XLA cache: it
#: parses the binary cache entry as a text proto first, and XLA:CPU compares its own tuning flags
#: (``+prefer-no-scatter``, ``+prefer-no-gather``) with the host's instruction-set features (a feature
#: the host really lacks, a cache from another machine, is still shown). When a step compiles without
#: XLA: grappler's remapper cannot fuse the pad of the last up-convolution with its gradient's shape
#: node, and grappler keeps the graph as it was before that pass (the step runs unfused there).
_FALSE_ERROR_LINE = re.compile(
    r"Error parsing text-format tensorflow\.XlaSerializedCacheEntry"
    r"|Target machine feature \+prefer-[\w-]+ is not\s+supported on the host machine"
    r"|meta_optimizer\.cc:\d+\] remapper failed: INVALID_ARGUMENT: Mutation::Apply error"
)


def native_line_shown(line: str, min_level: int) -> bool:
    """Whether a stderr ``line`` passes ``TF_CPP_MIN_LOG_LEVEL=min_level`` (0 all, 1 no INFO, 2 no
    WARNING, 3 no ERROR): C++ lines below the level, and from 1 absl's pre-initialisation notice and
    TensorFlow's false errors (:data:`_FALSE_ERROR_LINE`), are dropped; every other line is
    kept."""
    m = _NATIVE_LINE.match(line)
    if m:
        return "IWEF".index(m[1]) >= min_level and not (min_level >= 1 and _FALSE_ERROR_LINE.search(line))
    return not (min_level >= 1 and line.startswith(_ABSL_NOTICE))


def filter_native_lines(source: BinaryIO, sink: BinaryIO, min_level: int) -> None:
    """Copy the lines of ``source`` that :func:`native_line_shown` keeps at ``min_level`` to ``sink``,
    each as it arrives, until ``source`` ends."""
    for raw in source:
        if native_line_shown(raw.decode(errors="replace"), min_level):
            sink.write(raw)
            sink.flush()


@contextlib.contextmanager
def native_lines_filtered() -> Iterator[None]:
    """The process's stderr (file descriptor 2, where C++ code writes past Python's logging) filtered
    by :func:`native_line_shown` at ``TF_CPP_MIN_LOG_LEVEL`` while the block runs (nothing is filtered
    at level 0). The filter is a child process reading a pipe: it forwards every line as it comes and
    drains the pipe even when this process dies in the block (a C++ abort's last words stay visible)."""
    level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") or "0")
    if level < 1:
        yield
        return
    package_root = str(Path(__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path.insert(0, {package_root!r}); from shared_data.runtime.logs import filter_native_lines; "
        f"filter_native_lines(sys.stdin.buffer, sys.stdout.buffer, {level})"
    )
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        # its own process group: Ctrl-C or scancel to the trainer's group is the trainer's to report; the
        # filter ends when the pipe closes (this process's end, a kill -9 included)
        child = subprocess.Popen(
            [sys.executable, "-S", "-c", code], stdin=subprocess.PIPE, stdout=saved, process_group=0
        )
    except OSError:  # no process to filter with: the lines pass unfiltered
        child = None
    if child is None:
        os.close(saved)
        yield
        return
    os.dup2(child.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        child.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):  # a process started in the block holds the
            child.wait(timeout=10)  # pipe: the filter ends with it


def quiet_import(module: str) -> ModuleType:
    """Import ``module`` with :func:`native_lines_filtered`: absl and oneDNN print their start-up lines
    from C++ before TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL``."""
    if module in sys.modules:
        return importlib.import_module(module)
    with native_lines_filtered():
        return importlib.import_module(module)


def _handlers(kind: str) -> list[logging.Handler]:
    """The root logger's handlers this module added: ``"stream"`` (the console) or ``"file"`` (out.log)."""
    return [h for h in logging.getLogger().handlers if getattr(h, "_dlas", False) == kind]


def _formatter(process_index: int) -> logging.Formatter:
    tag = "" if process_index == 0 else f"[rank {process_index}] %(levelname)s "
    return logging.Formatter(f"%(asctime)s {tag}%(message)s", DATE_FORMAT)


class _RunLogHandler(logging.FileHandler):
    """``out.log``'s handler: a write that fails with an ``OSError`` (a full disk) is kept in
    :attr:`error` and ends the writing to the file, instead of logging's traceback on stderr for
    every later line; the run reports it (:func:`log_file_error`)."""

    error: OSError | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.error is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        err = sys.exc_info()[1]
        if not isinstance(err, OSError):
            super().handleError(record)
        elif self.error is None:
            self.error = err

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as err:
            self.error = self.error or err

    def close(self) -> None:
        try:
            super().close()
        except OSError as err:  # the buffered lines of a full disk
            self.error = self.error or err


def log_to_file(path: Path, process_index: int = 0) -> None:
    """Append every log line of this process to ``path`` (``out.log``) from now on; one file handler."""
    close_log_file()
    root = logging.getLogger()
    handler = _RunLogHandler(path, mode="a")
    handler.setFormatter(_formatter(process_index))
    handler._dlas = "file"  # type: ignore[attr-defined]
    root.addHandler(handler)


def log_to_file_only(level: int, message: str) -> None:
    """Write ``message`` to the run's ``out.log`` alone (not to the console), if one is open."""
    record = log.makeRecord(log.name, level, __file__, 0, message, (), None)
    for h in _handlers("file"):
        h.handle(record)


def log_file_error() -> tuple[Path, OSError] | None:
    """``(path, error)`` when a write to the run's ``out.log`` failed (a full disk), else None."""
    for h in _handlers("file"):
        if getattr(h, "error", None) is not None:
            return Path(h.baseFilename), h.error
    return None


def close_log_file() -> None:
    """Stop writing log lines to the run's ``out.log``."""
    for h in _handlers("file"):
        logging.getLogger().removeHandler(h)
        h.close()


def progress(iterable: Iterable, total: int, desc: str, enabled: bool) -> Iterator:
    """A tqdm progress bar over ``iterable`` when ``enabled`` and tqdm's stream (stderr) is a terminal;
    a batch job's log (a SLURM ``.out`` file) gets no carriage-return updates."""
    if not (enabled and sys.stderr.isatty()):
        return iter(iterable)
    from tqdm import tqdm

    return iter(tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True, mininterval=1.0))


def epoch_lines(
    epoch: int,
    seconds: float,
    samples: int,
    train_loss: float,
    val_loss: float,
    val_seconds: float,
    val_cut_by: str | None = None,
) -> list[str]:
    """The tutorial's per-epoch log lines (``epoch`` counted from 1); ``val_cut_by`` names the signal
    that cut the validation pass short (its loss is then not measured)."""
    val = f"  Avg val loss={val_loss:.6f}"
    if val_cut_by:
        val = f"  Avg val loss: not measured (the validation pass was cut short by {val_cut_by})"
    return [
        f"Time taken for epoch {epoch} is {seconds:.1f} sec, avg {samples / seconds:.1f} samples/sec",
        f"  Avg train loss={train_loss:.6f}",
        val,
        f"  Total validation time: {val_seconds:.1f} sec",
    ]


def checkpoint_line(seconds: float) -> str:
    """The line after an epoch's checkpoint save has started: its seconds on the training path (the
    wait for the previous save, the copy of the state to the host, the write's start)."""
    return f"  Checkpoint time: {seconds:.1f} sec"


def compile_line(train_sec: float, trace_sec: float, eval_sec: float) -> str:
    """The line after the steps are compiled: the train step's seconds (of which tracing), the eval step's."""
    return f"compile: train step {train_sec:.1f} s (trace {trace_sec:.1f} s), eval step {eval_sec:.1f} s"


def share_line(input_share: float, step_share: float) -> str:
    """The line after the epoch lines: shares of the epoch's wall time in input wait and in the step."""
    return f"  Input wait {100 * input_share:.1f}% of the epoch, train step {100 * step_share:.1f}%"


def input_bound_advice(loader: str) -> str:
    """What would feed an input-bound run with ``loader`` faster (the tutorial's lesson 2)."""
    kind = loader_kinds.loader_kind(loader)
    if kind.device_volumes and not kind.dali:
        return (
            "the volumes are already in device memory, so the host itself is the limit "
            "(check for other work on the machine)"
        )
    if kind.device_volumes:
        return "data_loader_config: device (a gather inside the compiled step, no DALI kernels beside it)"
    if kind.dali:
        return (
            "more dali_threads / num_data_workers, or data_loader_config: dali-device or device "
            "(volumes in GPU memory, no host copies)"
        )
    return (
        "more num_data_workers, data_loader_config: dali-npy (DALI), or device / dali-device (volumes in device memory)"
    )
