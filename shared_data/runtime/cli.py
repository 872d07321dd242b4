"""The trainers' command line, identical for TF and JAX: the config flags, the run flags, the tutorial's
flags (``--run_num``, ``--enable_benchy``, ``--enable_apex``) and its DDP-only flags, each refused
with what does the job here.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from shared_data.core import config as config_mod
from shared_data.core import config_cli, errors
from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError
from shared_data.core.files import check_not_input, check_writable, first_missing_folder
from shared_data.runtime import signals, sizing
from shared_data.runtime.checks import check_train_memory
from shared_data.runtime.logs import RANK_LOGGER, close_log_file, log_to_file_only, setup_logging
from shared_data.runtime.records import run_info_and_problem
from shared_data.runtime.run_folder import workdir_for

log = logging.getLogger("dlas")


#: The tutorial's DDP-only flags, each answered with what does the job here.
DDP_ONLY = {
    "--local_rank": "the process's devices come from the launcher (jax.distributed or TF_CONFIG / SLURM); "
    "see scripts/launch",
    "--bucket_cap_mb": "XLA combines and schedules the gradient all-reduces itself; its combining threshold "
    "is the XLA flag --xla_gpu_all_reduce_combine_threshold_bytes (XLA_FLAGS)",
    "--disable_broadcast_buffers": "the U-Net has no buffers to broadcast; parameters are replicated by the "
    "JAX mesh or the TF strategy",
    "--noddp": "a run without gradient all-reduce is a one-device run: --num_devices 1",
}


def add_run_args(parser: argparse.ArgumentParser, framework: str) -> None:
    """The trainers' run flags (both frameworks take the same): run folder, resume, devices, weights,
    the tutorial's ``--run_num``, ``--enable_benchy``, ``--enable_apex``, and its DDP-only flags
    (refused with the equivalent here)."""
    run = parser.add_argument_group("run")
    run.add_argument("--workdir", help=f"run folder (default: <exp_dir>/<config>[/<run_num>]/{framework})")
    run.add_argument("--run_num", help="tag of this run: the run folder is <exp_dir>/<config>/<run_num>/<framework>")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run folder")
    run.add_argument("--overwrite", action="store_true", help="delete the run folder's checkpoints and start again")
    run.add_argument("--num_devices", type=int, help="use the first N devices (default: all)")
    run.add_argument("--init_weights", help="canonical weights file (.npz) to start from")
    run.add_argument(
        "--stop_after_epoch",
        type=int,
        help="end this invocation after that epoch (like a job time limit); --resume continues",
    )
    run.add_argument("--save_weights", help="write the final weights to this canonical .npz file")
    run.add_argument(
        "--enable_benchy",
        action="store_true",
        help="instead of training, run the benchmark's IO, SYNTHETIC and FULL modes on this config",
    )
    run.add_argument(
        "--enable_apex",
        action="store_true",
        help="accepted for the tutorial's commands: Adam already runs fused inside the compiled step",
    )
    for flag in DDP_ONLY:
        run.add_argument(flag, nargs="?", const=True, help=argparse.SUPPRESS)


def check_run_args(args: argparse.Namespace, workdir: Path, framework: str) -> None:
    """Reject run flags that cannot work before any training starts.

    Raises:
        UserError: a DDP-only flag; ``--resume`` with ``--overwrite``; a run folder that cannot be
            written (a file, under a file, read-only) or belongs to the other framework;
            ``--num_devices`` below 1; a ``--save_weights`` path in a folder that does not exist or
            cannot be written, or that is a folder.
    """
    for flag, instead in DDP_ONLY.items():
        if getattr(args, flag.lstrip("-")) is not None:
            raise UserError(f"{flag} is PyTorch DDP's; not needed here: {instead}")
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite conflict: give one")
    check_writable(
        workdir, "--workdir" if args.workdir else "the run folder (exp_dir/<config>/<framework>)", folder=True
    )
    # a run.json that cannot be used is reported once, by the run that replaces it (EpochReport.begin)
    other = run_info_and_problem(workdir)[0].get("framework") if workdir.is_dir() else None
    if other and other != framework:
        raise UserError(f"{workdir} holds a {other} run; use another --workdir for {framework}")
    if args.num_devices is not None and args.num_devices < 1:
        raise UserError(f"--num_devices {args.num_devices}: expected at least 1")
    if args.stop_after_epoch is not None and args.stop_after_epoch < 1:
        raise UserError(f"--stop_after_epoch {args.stop_after_epoch}: expected at least 1")
    if args.save_weights:
        folder = Path(args.save_weights).absolute().parent
        if folder == workdir.absolute():  # the run folder itself is made by the run
            check_writable(workdir, "--save_weights", folder=True)
        elif not folder.exists():
            raise UserError(f"--save_weights {args.save_weights}: folder {folder} does not exist")
        else:
            check_writable(args.save_weights, "--save_weights")


def remove_failed_start(created: Path | None) -> None:
    """Remove the folders a run made (``created``, from :func:`first_missing_folder`) when it stopped
    on a user error before its first checkpoint: a failed start leaves no run folder behind."""
    if created is None or not created.is_dir() or any(created.rglob("checkpoints/*")):
        return
    shutil.rmtree(created, ignore_errors=True)
    log.info("removed %s: the run stopped before its first checkpoint", created)


#: What a SLURM job's signals and requeue do, the same in both trainers (end of ``--help``).
PREEMPTION = """\
preemption (SLURM; shared_data/runtime/signals.py):
  SIGUSR1, SIGTERM         during the steps: every rank saves at the next step boundary (mid_epoch/ in the
                           run folder, with the data cursor) and stops; under SLURM (SLURM_JOB_ID) the job
                           is requeued where it allows it (sbatch --requeue)
  SLURM_RESTART_COUNT      above 0 (a requeued job): resume from the newest checkpoint without --resume
"""


#: What a run writes in its folder (besides ``--save_weights``), each refused as an input.
RUN_FOLDER_OUTPUTS = (
    "run.json",
    "out.log",
    "metrics.jsonl",
    "checkpoints",
    "checksums",
    "mid_epoch",
    "tb",
    "profile",
    "run.lock",
)


def check_outputs_are_not_inputs(cfg, workdir: Path, save_weights: str | None, init_weights: str | None) -> None:
    """Refuse, before any work, a ``--save_weights`` file or a run-folder file (:data:`RUN_FOLDER_OUTPUTS`)
    that is one of the run's inputs: the training and validation volumes, their ``.npy`` twins, the
    ``--init_weights`` file (by path, symbolic link or hard link: :func:`check_not_input`); and a
    ``--save_weights`` file that is one of the run folder's own files or lies in one of its folders
    (by path also before the run writes them: the weights would replace the run's record).

    Raises:
        UserError: one line naming the output and the input or run file it would replace.
    """
    inputs = {"--init_weights": init_weights, **cfg.data_inputs()}
    own = {f"the run folder's {name}": workdir / name for name in RUN_FOLDER_OUTPUTS}
    check_not_input({"--save_weights": save_weights, **own}, inputs, "run's files")
    if save_weights is None:
        return
    check_not_input({"--save_weights": save_weights}, own, "weights")  # links to files that exist
    weights = Path(save_weights).resolve()
    for key, path in own.items():
        target = path.resolve()
        if weights == target or target in weights.parents:
            where = "is" if weights == target else "lies inside"
            raise UserError(
                f"--save_weights {save_weights} {where} {key} {path}, which the run writes: write the weights to "
                f"another path (e.g. {workdir / 'weights.npz'})"
            )


#: The environment variables each trainer reads, shown by ``--help``.
ENVIRONMENT = {
    "jax": """\
environment (several processes; scripts/launch/ starts them):
  JAX_COORDINATOR_ADDRESS  host:port of process 0; with it, JAX_NUM_PROCESSES (N) and JAX_PROCESS_ID (0..N-1)
                           start N processes on one or more hosts, e.g. on one host with 2 processes:
                             JAX_COORDINATOR_ADDRESS=localhost:12355 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=0 %(prog)s ...
                           (or: NPROC=2 bash scripts/launch/single_host.sh jax CONFIG)
  JAX_LOCAL_DEVICE_IDS     the GPUs (indices among those visible) this process drives, e.g. 0 or 2,3
  SLURM_*                  a SLURM step of several tasks (srun) joins by itself; each task drives the GPUs
                           SLURM gives it (--gpus-per-task) or its share of the node's (--gpus-per-node)
  DLAS_JAX_CLUSTER         auto: let jax.distributed detect the cluster (Kubernetes, Cloud TPU, ...);
                           mpi4py, k8s, ...: that detection method; none: stay one process
  JAX_PLATFORMS            cpu runs on the CPU (several CPU processes all-reduce over gloo)
  DLAS_START_TIMEOUT       seconds a process waits for the others to join (default 300)
caches and logs:
  JAX_COMPILATION_CACHE_DIR  the persistent compilation cache (default: the config's xla_cache_dir)
  XLA_FLAGS                XLA's flags (the kit adds its defaults, shown in the run's first lines)
"""
    + PREEMPTION,
    "tf": """\
environment (several processes; scripts/launch/ starts them):
  TF_CONFIG                the cluster and this worker's task (MultiWorkerMirroredStrategy), e.g.
                             TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]},
                                         "task": {"type": "worker", "index": 0}}' %(prog)s ...
  SLURM_*                  a SLURM step of several tasks (srun) joins by itself; each task drives the GPUs
                           SLURM gives it (--gpus-per-task) or its share of the node's (--gpus-per-node)
  DLAS_TF_PORT             the first worker port of a SLURM step (default: from the job id)
  DLAS_START_TIMEOUT       seconds a worker waits for the others to join (default 300)
caches and logs:
  TF_XLA_FLAGS             --tf_xla_persistent_cache_directory=DIR: the persistent compilation cache
                           (default: <xla_cache_dir>/tf of the config)
  TF_CPP_MIN_LOG_LEVEL     TensorFlow's C++ log lines: 0 all, 1 no INFO, 2 (default) no WARNING, 3 no ERROR
  XLA_FLAGS                XLA's flags (the kit adds its defaults, shown in the run's first lines)
"""
    + PREEMPTION,
}


def build_parser(framework: str) -> argparse.ArgumentParser:
    """The trainer's parser: the config flags (:func:`shared_data.core.config_cli.add_config_args`), the run
    flags and, after them, the environment variables the trainer reads (:data:`ENVIRONMENT`)."""
    name = {"jax": "JAX", "tf": "TensorFlow"}[framework]
    parser = make_parser(
        f"{framework}_impl.train",
        f"Train the cosmology U-Net with {name}.",
        epilog=ENVIRONMENT[framework],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_cli.add_config_args(parser)
    add_run_args(parser, framework)
    return parser


#: The benchmark command (the tutorial's "benchy"), run by module name: the comparison package sits
#: above this one, so the trainers reach it as a process, never as an import.
BENCHMARK_MODULE = "dlas_compare.benchmark"


def benchmark_command(
    framework: str,
    modes: Sequence[str],
    config_args: Sequence[str],
    *,
    label: str | None = None,
    out: str | Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line that runs :data:`BENCHMARK_MODULE` in a new Python process: ``framework`` in
    ``modes`` (``io``, ``synthetic``, ``full``) on the config that ``config_args`` select, named
    ``label`` in its table, appending its records to ``out``, then the ``extra`` arguments."""
    cmd = [sys.executable, "-m", BENCHMARK_MODULE, "--framework", framework, "--mode", *modes, *config_args]
    if label is not None:
        cmd += ["--label", label]
    if out is not None:
        cmd += ["--out", str(out)]
    return cmd + list(extra)


def benchy(framework: str, args: argparse.Namespace) -> int:
    """``--enable_benchy``: the tutorial's benchy modes are the benchmark command here; run it on the
    trainer's config and return its exit status (its errors are its own one ``error:`` line)."""
    cmd = benchmark_command(framework, ("io", "synthetic", "full"), config_cli.config_argv(args))
    log.info("--enable_benchy: python -m %s", shlex.join(cmd[2:]))
    return subprocess.run(cmd).returncode


def main(
    framework: str,
    train_and_evaluate: Callable[..., tuple],
    argv: Sequence[str] | None = None,
    *,
    initialize: Callable[[], str | None],
    process_index: Callable[[], int],
    lost_peer: Callable[[BaseException], str | None],
) -> int:
    """The trainers' command line: parse, join a multi-process run (``initialize``, whose line every
    rank prints with its tag), set up logging for this rank, train in the run folder, write
    ``--save_weights`` (main process). SIGTERM and Ctrl-C end in one line, exit 143 / 130
    (:mod:`shared_data.runtime.signals`). A collective that fails because another process of the run
    ended (``lost_peer``: the framework's reading of its error) ends in one line naming that process
    and the checkpoint kept, exit code 2, at once: the distributed runtime's shutdown would wait for
    the lost process, then abort."""
    with signals.handled():
        try:
            return _main(framework, train_and_evaluate, argv, initialize=initialize, process_index=process_index)
        except Exception as err:
            lost = lost_peer(err)
            if lost is None:
                raise
            # the interpreter's finalisation would end in the runtime's shutdown, which waits for the lost
            # process and then aborts: the process ends after the atexit functions (the loader's workers end there)
            errors.EXIT_AFTER_ATEXIT.append("a lost process")
            message = f"process {process_index()} of this run lost {lost}; it stops {signals.where()}"
            log_to_file_only(logging.ERROR, f"error: {message}")
            raise UserError(message) from None


def resume_requested(resume: bool, overwrite: bool, env=None) -> tuple[bool, bool]:
    """``(resume, overwrite)`` of a run: the flags, except in a requeued SLURM job
    (``SLURM_RESTART_COUNT`` above 0), which resumes whatever its command line says, so a preempted
    job continues from its checkpoint and an ``--overwrite`` in the job script clears only its first run."""
    restarts = (os.environ if env is None else env).get("SLURM_RESTART_COUNT", "0")
    if restarts.isdigit() and int(restarts) > 0:
        log.info("SLURM_RESTART_COUNT=%s: a requeued job resumes from its newest checkpoint", restarts)
        return True, False
    return resume, overwrite


def _main(framework, train_and_evaluate, argv, *, initialize, process_index) -> int:
    args = build_parser(framework).parse_args(argv)
    setup_logging()
    if args.enable_apex:
        log.info("--enable_apex: Adam already runs fused inside the compiled step; nothing to enable")
    cfg = config_cli.config_from_args(args)
    if args.enable_benchy:
        return benchy(framework, args)
    workdir = workdir_for(cfg, framework, args.workdir, args.run_num)
    check_run_args(args, workdir, framework)
    save_weights = args.save_weights
    if save_weights is None and (workdir / "weights.npz").is_file():
        # an earlier --save_weights left the run's weights there; they follow the run, not stay behind it
        save_weights = str(workdir / "weights.npz")
        log.info("%s is updated at the end of this run (an earlier --save_weights wrote it)", save_weights)
    elif save_weights is None and (cfg.ema_decay or cfg.quality_every_epochs):
        # the evaluated model (the weight average) is in no checkpoint: predict/export --workdir read it here
        save_weights = str(workdir / "weights.npz")
        log.info("%s receives the weights this run evaluates, at its end", save_weights)
    epoch_steps = config_mod.steps_per_epoch(cfg)
    warning = sizing.oversized_warning(cfg, epoch_steps * cfg.num_epochs, "training", epoch_steps=epoch_steps)
    if warning:
        log.warning(warning)
    created = first_missing_folder(workdir)  # what a failed start removes again
    check_outputs_are_not_inputs(cfg, workdir, save_weights, args.init_weights)
    check_train_memory(cfg, framework)  # before TensorFlow's runtime starts its thread pools (it aborts there)
    joined = initialize()
    signals.reclaim()  # the distributed runtime has started: our handlers, and a signal that came meanwhile
    setup_logging(process_index())
    if joined:
        logging.getLogger(RANK_LOGGER).info(joined)
    resume, overwrite = resume_requested(args.resume, args.overwrite)
    try:
        train_and_evaluate(
            cfg,
            workdir,
            resume=resume,
            overwrite=overwrite,
            num_devices=args.num_devices,
            init_weights=args.init_weights,
            stop_after_epoch=args.stop_after_epoch,
            save_weights=save_weights,
        )
    except UserError as err:
        log_to_file_only(logging.ERROR, f"error: {err}")  # run_cli prints the one line on stderr
        close_log_file()
        if process_index() == 0:
            remove_failed_start(created)
        raise
    except KeyboardInterrupt as err:
        log_to_file_only(logging.WARNING, str(err) or "interrupted")
        raise
    finally:
        close_log_file()
    return 0
