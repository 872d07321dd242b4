"""What tests of trainer processes share, importing neither framework: the XLA flags of a test's JAX
process (:func:`cpu_xla_flags`), and a real signal at a chosen training batch, so that a stop lands
at a known step whatever the machine's load. :func:`at_batch` wraps a trainer's ``make_input`` in
this process; :data:`SIGNAL_AT` runs a trainer as a process with it,
``SIGNAL_AT + [BATCH, ACTION, "-m", "FRAMEWORK_impl.train", *trainer_argv]`` (the kit sees the
command ``python -m FRAMEWORK_impl.train``), where ACTION is a signal's name (``SIGUSR1``: the
process sends it to itself) or ``wait:PATH`` (the process creates the file PATH and waits for a
signal from outside: a test that signals a process group, a SLURM requeue) or ``hold-save:EPOCH:PATH``
(BATCH unused: the background half of the checkpoint save of EPOCH creates PATH and waits, for a
kill during an asynchronous write: :func:`hold_save`); :func:`interpreter` is
the same as an interpreter for a launch script's ``PY``."""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: ``python -c`` that runs ``-m MODULE``'s ``main(trainer_argv)`` as its console script does, with
#: ACTION while its training input hands out batch BATCH (the module docstring).
SIGNAL_AT = [
    sys.executable,
    "-c",
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import processes; processes.main()",
]
#: How long ``wait:PATH`` waits for the signal before the run goes on without it.
WAIT_SEC = 120


def cpu_xla_flags(devices: int) -> str:
    """``XLA_FLAGS`` of a test's JAX process on ``devices`` CPU devices. Without a GPU, XLA's LLVM at
    -O0 because the suite compiles hundreds of tiny steps and runs few steps of each: -O0 takes about
    40% off a tiny step's compile, and its steps take about twice as long (the fused elementwise
    kernels; convolutions run in the same library kernels). On a GPU machine the flag would slow the
    GPU kernels that the gpu tests time."""
    optimization = "" if shutil.which("nvidia-smi") else " --xla_backend_optimization_level=0"
    return f"--xla_force_host_platform_device_count={devices}{optimization}"


def process_env(framework: str, rank: int, ports: list[int], timeout: str = "120") -> dict:
    """The environment of process ``rank`` of a run of ``len(ports)`` processes on this host, started
    without a launcher: this process's variables less any launcher's, the start time-out, one CPU
    device, and JAX's coordinator at the first port or TF's workers at all of them."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JAX_", "OMPI_", "TF_CONFIG"))}
    env.update(DLAS_START_TIMEOUT=timeout, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    if framework == "jax":
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{ports[0]}", JAX_NUM_PROCESSES=str(len(ports)))
        env["JAX_PROCESS_ID"] = str(rank)
    else:
        workers = [f"localhost:{p}" for p in ports]
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    return env


def at_batch(make_input, batch: int, action: Callable[[], None]):
    """``make_input`` whose training input calls ``action()`` while it hands out its batch number
    ``batch`` (0-based, counted over the epochs of this process), inside the trainer's wait for that
    batch; validation input unchanged."""
    handed = [0]

    def with_action(cfg, split, *args):
        inp = make_input(cfg, split, *args)
        if split != "train":
            return inp
        read = inp.epoch

        def epoch(e):
            for b in read(e):
                if handed[0] == batch:
                    action()
                handed[0] += 1
                yield b

        inp.epoch = epoch
        return inp

    return with_action


def send(signum: int) -> Callable[[], None]:
    """The action that sends this process ``signum``."""
    return lambda: os.kill(os.getpid(), signum)


def wait_for_signal(marker: Path) -> Callable[[], None]:
    """The action that creates ``marker`` and waits (up to :data:`WAIT_SEC`) until SIGINT, SIGTERM or
    SIGUSR1 arrives; the trainer's handler of it then runs as it would have."""

    def wait() -> None:
        arrived = []

        def note(signum, frame):
            arrived.append(signum)
            if callable(previous[signum]):
                previous[signum](signum, frame)

        previous = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
        try:
            marker.touch()
            end = time.monotonic() + WAIT_SEC
            while not arrived and time.monotonic() < end:
                time.sleep(0.01)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    return wait


def hold_save(checkpoints_class, epoch: int, marker: Path) -> None:
    """Make ``checkpoints_class`` (a framework's ``Checkpoints``) hold the background half of the save of
    ``epoch`` at its start: it creates ``marker`` and waits while the framework's writer goes on (a test
    kills or signals the process there: during an asynchronous write), until the test creates
    ``marker`` with the suffix ``.release`` or :data:`WAIT_SEC` pass."""
    complete = checkpoints_class._complete
    release = marker.with_name(marker.name + ".release")

    def held(self, saved: int) -> None:
        if saved == epoch:
            marker.touch()
            end = time.monotonic() + WAIT_SEC
            while not release.exists() and time.monotonic() < end:
                time.sleep(0.01)
        complete(self, saved)

    checkpoints_class._complete = held


def interpreter(folder: Path, batch: int, action: str) -> Path:
    """An executable ``folder/python`` that runs ``python -m MODULE ARGS`` as :data:`SIGNAL_AT` does,
    with ``action`` at training batch ``batch``: the ``PY`` of a launch script."""
    path = folder / "python"
    path.write_text(f'#!/bin/sh\nexec {shlex.join([*SIGNAL_AT, str(batch), action])} "$@"\n')
    path.chmod(0o755)
    return path


def main() -> None:
    """:data:`SIGNAL_AT`'s command line: ``BATCH ACTION -m MODULE *trainer_argv``."""
    from shared_data.core.errors import run_cli

    batch, action, dash_m, module, *argv = sys.argv[1:]
    assert dash_m == "-m", sys.argv
    train = importlib.import_module(module)
    if action.startswith("hold-save:"):
        epoch, marker = action.split(":", 2)[1:]
        hold_save(train.Checkpoints, int(epoch), Path(marker))
    else:
        act = wait_for_signal(Path(action[5:])) if action.startswith("wait:") else send(signal.Signals[action])
        train.data_mod.make_input = at_batch(train.data_mod.make_input, int(batch), act)
    raise SystemExit(run_cli(train.main, argv))
