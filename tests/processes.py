"""What tests of trainer processes share, importing neither framework: the XLA flags of a test's JAX
process (:func:`cpu_xla_flags`), and a real signal at a chosen training batch, so that a stop lands at
a known step whatever the machine's load: :func:`signalling_input` wraps a trainer's ``make_input``
in this process; :data:`SIGNAL_AT` runs a trainer as a process with it
(``SIGNAL_AT + [FRAMEWORK, BATCH, SIGNUM, *trainer_argv]``, from the checkout's root)."""

from __future__ import annotations

import importlib
import os
import shutil
import sys

#: ``python -c`` that runs ``FRAMEWORK_impl.train.main(trainer_argv)`` as its console script does,
#: sending itself ``SIGNUM`` while its training input hands out batch ``BATCH``.
SIGNAL_AT = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import processes; processes.main()"]


def cpu_xla_flags(devices: int) -> str:
    """``XLA_FLAGS`` of a test's JAX process on ``devices`` CPU devices. Without a GPU, XLA's LLVM at
    -O0 because the suite compiles hundreds of tiny steps and runs few steps of each: -O0 takes about
    40% off a tiny step's compile, and its steps take about twice as long (the fused elementwise
    kernels; convolutions run in the same library kernels). On a GPU machine the flag would slow the
    GPU kernels that the gpu tests time."""
    optimization = "" if shutil.which("nvidia-smi") else " --xla_backend_optimization_level=0"
    return f"--xla_force_host_platform_device_count={devices}{optimization}"


def signalling_input(make_input, batch: int, signum: int):
    """``make_input`` whose training input sends this process ``signum`` while it hands out its batch
    number ``batch`` (0-based, counted over the epochs of this process); validation input unchanged."""
    handed = [0]

    def signalling(cfg, split, *args):
        inp = make_input(cfg, split, *args)
        if split != "train":
            return inp
        read = inp.epoch

        def epoch(e):
            for b in read(e):
                if handed[0] == batch:
                    os.kill(os.getpid(), signum)
                handed[0] += 1
                yield b

        inp.epoch = epoch
        return inp

    return signalling


def main() -> None:
    """:data:`SIGNAL_AT`'s command line: ``FRAMEWORK BATCH SIGNUM *trainer_argv``."""
    from shared_data.core.errors import run_cli

    framework, batch, signum, *argv = sys.argv[1:]
    train = importlib.import_module(f"{framework}_impl.train")
    train.data_mod.make_input = signalling_input(train.data_mod.make_input, int(batch), int(signum))
    raise SystemExit(run_cli(train.main, argv))
