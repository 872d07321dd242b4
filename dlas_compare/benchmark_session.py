"""The benchmarks of one framework in one process: which ``Bench`` a framework has, the order of the
modes (SYNTHETIC, IO, FULL) and what carries over between them (:class:`Session`), and the
data-parallel loss check (:func:`replica_check`). Each mode is timed by
:func:`dlas_compare.benchmark_timing.run_bench`; the command line is :mod:`dlas_compare.benchmark`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from dlas_compare.benchmark_timing import run_bench, stage
from shared_data.core import config as config_mod
from shared_data.core.config import Config
from shared_data.core.errors import UserError

#: The implementations a benchmark runs (``--framework``).
FRAMEWORKS = ("jax", "tf", "torch")


def make_bench(framework: str, cfg: Config, mode: str, num_devices: int | None = None, step_from=None, input_from=None):
    """The framework's ``Bench`` (``jax_impl.bench``, ``tf_impl.bench`` or ``dlas_compare.torch_ref``);
    ``step_from``: a bench of the same framework whose train step and state it takes over (a config
    that differs only in the input, :data:`INPUT_KEYS`), ``input_from``: one whose input pipeline it
    takes over (the same config)."""
    return bench_class(framework)(cfg, mode, num_devices, step_from=step_from, input_from=input_from)


def bench_class(framework: str):
    """The ``Bench`` class of ``framework``; its first call imports the framework (seconds)."""
    if framework == "jax":
        from jax_impl.bench import Bench
    elif framework == "tf":
        from tf_impl.bench import Bench
    elif framework == "torch":
        from dlas_compare.torch_ref import Bench
    else:
        raise UserError(f"--framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    return Bench


def run(
    framework: str,
    cfg: Config,
    mode: str,
    warmup: int,
    steps: int,
    windows: int,
    num_devices: int | None = None,
    label: str | None = None,
    window_sec: float | None = None,
    min_steps: int = 1,
) -> dict:
    """Benchmark one (framework, config, mode) in a bench of its own; return the result record."""
    return Session(framework, num_devices).run(cfg, [mode], warmup, steps, windows, label, window_sec, min_steps)[0]


#: the config keys of the input pipeline: a rung that changes only these keeps the compiled train step
INPUT_KEYS = ("data_loader_config", "num_data_workers")


class Session:
    """Benchmarks of one framework run one after another in this process, sharing what carries over:
    the framework's import and device set-up; the train step (compiled, autotuned, its state) while
    the config differs only in :data:`INPUT_KEYS`; and, within one :meth:`run`, the input pipeline of
    IO, which FULL takes over. A run measures SYNTHETIC first (building the step), then IO (a new
    pipeline), then FULL; IO and FULL drain what their pipeline read ahead before timing
    (:func:`run_bench`), except a FULL whose IO outran the step's SYNTHETIC (measured in this session
    for the same step): its queue cannot lift FULL above the step, and a drain would only add steps.
    Its pipelines are closed when it ends, so their workers do not read during
    the next run.
    """

    def __init__(self, framework: str, num_devices: int | None = None):
        self.framework, self.num_devices = framework, num_devices
        self.step_from = None  # the bench that stepped last: its train step and state (JAX donates it)
        self.step_key: dict | None = None
        self.step_rate: float | None = None  # SYNTHETIC samples/s of that train step, once measured

    def run(
        self,
        cfg: Config,
        modes: Sequence[str],
        warmup: int,
        steps: int,
        windows: int,
        label: str | None = None,
        window_sec: float | None = None,
        min_steps: int = 1,
    ) -> list[dict]:
        """Benchmark ``cfg`` in ``modes``; return the records in the order of ``modes``. One line on
        stderr per stage (set-up and compilation, timing, result), since a large config takes minutes."""
        key = {k: v for k, v in config_mod.config_dict(cfg).items() if k not in INPUT_KEYS}
        if key != self.step_key:
            self.step_from, self.step_key, self.step_rate = None, key, None
        records, input_from, pipelines = {}, None, []
        for mode in [m for m in ("synthetic", "io", "full") if m in modes]:
            what = f"[benchmark] {self.framework} {mode}"
            reuses_step = mode != "io" and self.step_from is not None
            reuses_input = mode == "full" and input_from is not None
            if mode == "io" and "full" in modes and self.step_from is None:
                stage(f"{what}: compiling the train step for FULL before its input pipeline starts")
                self.step_from = make_bench(self.framework, cfg, "synthetic", self.num_devices)
            source = "one cached batch" if mode == "synthetic" else f"{cfg.data_loader_config} loader"
            taken = [name for name, yes in (("train step", reuses_step), ("input pipeline", reuses_input)) if yes]
            stage(f"{what}: setting up ({source}, batch {cfg.global_batch_size}{', taking over the ' if taken else ''}"
                  f"{' and the '.join(taken)})")  # fmt: skip
            if mode != "io" and not reuses_step:  # the framework's import, then a compilation
                t0 = time.perf_counter()
                bench_class(self.framework)
                imported = f"{self.framework} imported in {time.perf_counter() - t0:.1f} s"
                stage(f"{what}: {imported}; building the model and compiling its train step")
            bench = make_bench(
                self.framework,
                cfg,
                mode,
                self.num_devices,
                step_from=self.step_from,  # IO takes only its device set-up (TF's strategy)
                input_from=input_from if mode == "full" else None,
            )
            # a taken-over step is compiled again where this mode's batch differs (a device loader's crop plans)
            reused = [name for name in taken if name != "train step" or not bench.compiled_step]
            ready = (
                "input pipeline ready"
                if mode == "io"
                else "the train step reused"
                if "train step" in reused
                else f"step compiled in {bench.compile_sec:.1f} s"
            )
            stage(f"{what}: {ready}; warm-up, then {windows} timed windows of up to {steps} steps")
            # a loader that outruns the step cannot lift FULL above the step, whatever it read ahead
            outrun = (
                mode == "full" and "io" in records and (self.step_rate or math.inf) <= records["io"]["samples_per_sec"]
            )
            record = run_bench(bench, cfg, mode, warmup, steps, windows, label, window_sec, min_steps, not outrun)
            record["reused"] = reused
            if mode == "synthetic":
                self.step_rate = record["samples_per_sec"]
            stage(f"{what}: {record['samples_per_sec']:.1f} samples/s")
            records[mode] = record
            if mode != "io":
                self.step_from = bench
            if mode == "io":
                input_from = bench
            if mode != "synthetic":
                pipelines.append(bench.batches)
        for batches in pipelines:  # stop reading now, not in the next rung's windows
            batches.close()
        return [records[m] for m in modes]


#: relative difference of a step's loss on one device and on several at which the two count as equal:
#: the same crops, weights and arithmetic summed in another order (float32) differ by ~1e-6
SAME_LOSS_RTOL = 1e-5


def replica_check(framework: str, cfg: Config, num_devices: int, steps: int) -> dict:
    """The data-parallel correctness check: ``steps`` FULL train steps of ``cfg`` from its initial
    weights (seed ``cfg.seed``), once on one device and once on ``num_devices`` replicas, at the same
    global batch (``num_devices`` x the local batch of ``cfg``, the data-parallel rung's); the loss
    of each step on each, and whether every pair agrees within :data:`SAME_LOSS_RTOL` (relative).
    The losses agree only where the input gives step t the same crops whatever the number of replicas.

    Returns:
        ``{"replicas", "global_batch", "steps", "losses_one_device", "losses_replicas",
        "max_rel_diff", "rtol", "equal"}``.
    """
    _, local = config_mod.batch_sizes(cfg, num_devices)
    same = config_mod.replace(cfg, global_batch_size=local * num_devices, local_batch_size=None)
    losses = {}
    for devices in (1, num_devices):
        what = f"{steps} steps on {devices} device(s), global batch {local * num_devices}"
        stage(f"[benchmark] {framework} replica check: {what}")
        bench = make_bench(framework, same, "full", devices)
        got = []
        for _ in range(steps):
            bench.step()
            got.append(bench.loss())
        bench.batches.close()
        losses[devices] = got
    one, many = losses[1], losses[num_devices]
    diff = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(one, many))
    return {
        "replicas": num_devices,
        "global_batch": local * num_devices,
        "steps": steps,
        "losses_one_device": one,
        "losses_replicas": many,
        "max_rel_diff": diff,
        "rtol": SAME_LOSS_RTOL,
        "equal": diff <= SAME_LOSS_RTOL,
    }
