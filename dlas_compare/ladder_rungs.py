"""The ladder's rungs: the lessons (:data:`RUNGS`), the settings each adds, what a framework finds on
this machine (:func:`probe`), the plan that follows from it (:func:`plan`: which rungs run, which are
skipped and why), and the flags and ``XLA_FLAGS`` of a rung's benchmark process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from dlas_compare.benchmark_session import FRAMEWORKS
from shared_data.core.commands import command_name
from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.runtime.xla_flags import default_xla_flags_off, kit_xla_flags

BASELINE_WORKERS = 4  # the tutorial's baseline worker count
MORE_WORKERS = 8
CPU_REPLICAS = 2  # CPU devices of the data-parallel rung on a machine without GPUs
REPLICA_CHECK_STEPS = 2  # train steps of the data-parallel rung's loss check: the first loss, then one after an update
#: the settings the rungs own; a user's value for them would break the ladder's steps
LADDER_KEYS = ("data_loader_config", "num_data_workers", "enable_amp", "enable_jit", "local_batch_size")
DALI_PLUGINS = {"jax": "nvidia.dali.plugin.jax", "tf": "nvidia.dali.plugin.tf", "torch": "nvidia.dali.plugin.pytorch"}
MODULES = {"jax": "jax", "tf": "tensorflow", "torch": "torch"}


@dataclasses.dataclass(frozen=True)
class Rung:
    """One lesson: ``name`` (records), ``title`` (table and figure), ``lesson`` (its one line)."""

    name: str
    title: str
    lesson: str


RUNGS = (
    Rung("baseline", "baseline", "the tutorial's starting point"),
    Rung("workers", "more workers", "more workers hide the read latency"),
    Rung("dali", "DALI", "DALI moves decode and augmentation off the Python workers"),
    Rung("amp", "mixed precision", "AMP halves the math (half-precision tensor cores, half the bytes)"),
    Rung("compile", "compilation", "compilation fuses kernels and picks layouts"),
    Rung("device", "GPU-resident input", "GPU-resident input takes the host out of the input path"),
    Rung("data_parallel", "data parallel", "data parallel multiplies the samples per step"),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a rung's benchmark runs with: config keys, whether the kit's XLA flags are on
    (:func:`shared_data.runtime.xla_flags.kit_xla_flags` of the framework), devices and the per-device batch (samples;
    None: the config's global batch on one device), and the CPU devices its process makes
    (``host_devices`` > 1: ``--xla_force_host_platform_device_count``, which the TF benchmark follows
    with logical CPU devices; 1: the machine's)."""

    data_loader_config: str = "lowmem"
    num_data_workers: int = BASELINE_WORKERS
    enable_amp: bool = False
    enable_jit: bool = False
    kit_xla_flags: bool = False
    num_devices: int = 1
    local_batch_size: int | None = None
    host_devices: int = 1


@dataclasses.dataclass(frozen=True)
class Probe:
    """What one framework finds on this machine (:func:`probe`).

    Attributes:
        framework: ``jax``, ``tf`` or ``torch``.
        reason: why the framework cannot run here at all; None when it can.
        gpus: GPUs it sees.
        devices: devices it sees (GPUs, else its CPU devices).
        device: the first device's name.
        dali: why DALI's plugin for it does not import; None when it does.
    """

    framework: str
    reason: str | None = None
    gpus: int = 0
    devices: int = 0
    device: str = ""
    dali: str | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    """Rung ``index`` (1-based) of ``framework``'s ladder: its cumulative settings (for a skipped
    rung, the ones it would have had), why it is skipped (None: it runs) and a note on what it
    shows on this machine."""

    framework: str
    index: int
    rung: Rung
    settings: Settings
    skip: str | None = None
    note: str = ""


_PROBE_CODE = {
    "jax": (
        "import jax\nds = jax.devices()\n"
        "info = dict(gpus=sum(d.platform == 'gpu' for d in ds), devices=len(ds),"
        " device=getattr(ds[0], 'device_kind', ds[0].platform))\n"
    ),
    "tf": (
        "import tensorflow as tf\ngpus = tf.config.list_physical_devices('GPU')\n"
        "info = dict(gpus=len(gpus), devices=len(gpus) or len(tf.config.list_logical_devices('CPU')),"
        " device='GPU' if gpus else 'CPU')\n"
    ),
    "torch": (
        "import torch\nn = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "info = dict(gpus=n, devices=n, device=torch.cuda.get_device_name(0) if n else 'cpu')\n"
    ),
}


def probe(framework: str, timeout: int = 180) -> Probe:
    """Ask ``framework`` in a fresh process (frameworks never share the ladder's process) which
    devices it sees and whether DALI's plugin for it imports.

    Raises:
        UserError: ``framework`` is not one of :data:`dlas_compare.benchmark_session.FRAMEWORKS`.
    """
    if framework not in _PROBE_CODE:
        raise UserError(f"framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    import importlib.util

    if importlib.util.find_spec(MODULES[framework]) is None:
        return Probe(framework, reason=f"{MODULES[framework]} is not installed")
    code = (
        "import importlib, json\n"
        + _PROBE_CODE[framework]
        + "try:\n"
        + f"    importlib.import_module({DALI_PLUGINS[framework]!r})\n"
        + "    info['dali'] = None\n"
        + "except Exception as err:\n"
        + "    info['dali'] = f'{type(err).__name__}: {err}'\n"
        + "print(json.dumps(info))\n"
    )
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Probe(framework, reason=f"its device probe timed out after {timeout} s")
    lines = res.stdout.strip().splitlines()
    if res.returncode or not lines:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return Probe(framework, reason=f"its device probe failed ({tail})")
    info = json.loads(lines[-1])
    dali = info["dali"] and f"DALI's {framework} plugin does not import here ({info['dali']})"
    if framework == "torch" and not info["gpus"]:
        return Probe(framework, reason="the PyTorch reference runs on a GPU only, and torch sees none", dali=dali)
    return Probe(framework, None, info["gpus"], info["devices"], info["device"], dali)


def _change(
    rung: Rung,
    framework: str,
    found: Probe,
    cfg: Config,
    current: Settings,
    more_workers: int,
    num_devices: int | None,
    cpu_count: int,
) -> tuple[dict, str | None, str]:
    """The settings ``rung`` changes, why it cannot run (None: it can), and a note for its line."""
    gpu = found.gpus > 0
    torch = framework == "torch"
    if rung.name == "baseline":
        if torch:
            return {}, None, "the reference runs channels_last_3d, cudnn.benchmark, fused Adam and TF32 in every rung"
        return {}, None, ""
    if rung.name == "workers":
        note = f"{more_workers} worker threads on {cpu_count} cores" if cpu_count < more_workers else ""
        return {"num_data_workers": more_workers}, None, note
    if rung.name == "dali":
        change = {"data_loader_config": "dali-npy"}
        missing = [p for p in cfg.npy_files("train") if not p.is_file()]
        if found.dali:
            return change, found.dali, ""
        if missing:
            train = cfg.data_file("train")
            return change, f"no .npy twin {missing[0]} ({command_name('shared_data.data.convert')} {train})", ""
        where = "" if gpu else "CPU-only pipeline, "
        return change, None, f"{where}dali_threads={cfg.dali_threads}"
    if rung.name == "amp":
        note = "" if gpu else "on a CPU, which has no GPU tensor cores"
        return {"enable_amp": True}, None, note
    if rung.name == "compile":
        if torch:
            return (
                {},
                "the reference has no switch: channels_last_3d, cudnn.benchmark and fused Adam are on from "
                "the baseline, and the benchmark does not run torch.compile",
                "",
            )
        flags = " ".join(kit_xla_flags(framework))
        on_cpu = "" if gpu else ", which act on GPU convolutions only"
        if framework == "jax":
            note = f"JAX compiles every rung; this rung adds the kit's XLA flags ({flags}){on_cpu}"
        else:
            note = f"XLA for the train step (jit_compile) and the kit's XLA flags ({flags}){on_cpu}"
        return {"enable_jit": True, "kit_xla_flags": True}, None, note
    if rung.name == "device":
        change = {"data_loader_config": "device"}
        if torch:
            return change, "the reference has no GPU-resident loader (device is JAX's and TF's)", ""
        if not gpu:
            return change, "no GPU: the lesson is volumes in GPU memory (on a CPU device means host memory)", ""
        return change, None, "volumes in GPU memory, crops and symmetries by a gather inside the compiled step"
    # data parallel
    if not gpu and not torch:  # CPU devices: the data-parallel code path, checked, not a speed-up
        n = num_devices or CPU_REPLICAS
        change = {"num_devices": n, "local_batch_size": cfg.global_batch_size, "host_devices": n}
        note = (
            f"{n} CPU devices (XLA_FLAGS --xla_force_host_platform_device_count={n}) sharing this machine's cores: "
            f"correctness, not speed; global batch {n} x {cfg.global_batch_size}, losses checked against one device"
        )
        return change, None, note
    n = num_devices or found.gpus
    change = {"num_devices": n, "local_batch_size": cfg.global_batch_size}
    if torch:
        return change, "the reference's data parallel is dlas_compare.torch_ddp (torchrun, SYNTHETIC only)", ""
    if num_devices is None and found.gpus < 2:
        return change, "1 GPU: data parallel needs several GPUs (--num_devices N runs it on N of any devices)", ""
    if n > found.devices:
        return change, f"--num_devices {n}: {framework} sees {found.devices} device(s)", ""
    return change, None, f"global batch {n} x {cfg.global_batch_size}, losses checked against one device"


def plan(
    framework: str,
    found: Probe,
    cfg: Config,
    more_workers: int = MORE_WORKERS,
    num_devices: int | None = None,
    cpu_count: int | None = None,
) -> list[Step]:
    """``framework``'s ladder on this machine: one :class:`Step` per rung of :data:`RUNGS`, each with
    the settings of the last rung that ran plus its own change, or the reason it is skipped.

    ``found`` is the framework's :func:`probe`; ``cpu_count`` defaults to ``os.cpu_count()``.
    """
    cpu_count = cpu_count or os.cpu_count() or 1
    steps, current = [], Settings()
    for index, rung in enumerate(RUNGS, 1):
        if found.reason:
            steps.append(Step(framework, index, rung, current, skip=found.reason))
            continue
        change, skip, note = _change(rung, framework, found, cfg, current, more_workers, num_devices, cpu_count)
        settings = dataclasses.replace(current, **change)
        if skip is None:
            current = settings
        steps.append(Step(framework, index, rung, settings, skip, note))
    return steps


def benchmark_args(settings: Settings) -> list[str]:
    """The :mod:`dlas_compare.benchmark` flags of ``settings``."""
    args = [
        "--data_loader_config",
        settings.data_loader_config,
        "--num_data_workers",
        str(settings.num_data_workers),
        "--enable_amp" if settings.enable_amp else "--no-enable_amp",
        "--enable_jit" if settings.enable_jit else "--no-enable_jit",
        "--num_devices",
        str(settings.num_devices),
    ]
    if settings.local_batch_size is not None:
        args += ["--local_batch_size", str(settings.local_batch_size)]
    if settings.num_devices > 1:
        args += ["--replica_check", str(REPLICA_CHECK_STEPS)]
    return args


def xla_flags(settings: Settings, environ: dict | None = None) -> str:
    """The ``XLA_FLAGS`` a rung's process starts with: the caller's, with the kit's defaults named
    off before the compilation rung (the frameworks add the defaults at import unless named), and
    the CPU device count of ``settings.host_devices`` where it is above 1."""
    flags = (os.environ if environ is None else environ).get("XLA_FLAGS", "")
    return with_host_devices(flags if settings.kit_xla_flags else default_xla_flags_off(flags), settings.host_devices)


def with_host_devices(flags: str, n: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with ``--xla_force_host_platform_device_count=n`` in place of
    any value it names; ``flags`` unchanged for ``n`` = 1."""
    if n <= 1:
        return flags
    kept = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count=")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={n}"])


def process_xla_flags(step: Step, environ: dict | None = None) -> str:
    """The ``XLA_FLAGS`` the benchmark process of ``step`` starts with, which a process reads once.
    JAX: :func:`xla_flags` (its rungs before compilation run without the kit's flags, so the
    compilation rung starts a process of its own). TF and PyTorch: the caller's, with which the kit
    adds its flags at import: the flags act on XLA's compilations only, and before TF's compilation
    rung XLA compiles only DALI's crop and copy functions there, which hold no convolution (all that
    ``--xla_gpu_force_conv_nhwc`` changes) and no fusion worth autotuning; PyTorch does not read them.
    So TF's and PyTorch's rungs share one process, all but the data-parallel rung on CPU devices
    (``host_devices`` > 1), which needs a process of its own: a process sets its devices once."""
    if step.framework == "jax":
        return xla_flags(step.settings, environ)
    caller = (os.environ if environ is None else environ).get("XLA_FLAGS", "")
    return with_host_devices(caller, step.settings.host_devices)
