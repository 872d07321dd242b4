"""DALI pipelines shared unchanged by TF and JAX: ``dali-npy`` (alias ``dali-lowmem``), ``dali-h5`` and
``dali-device``.

Both produce, per step, ``inputs`` (B, s, s, s, N_in), ``targets`` (B, s, s, s, N_out) float32 NDHWC
and ``mask`` (B,), exactly the samples of the NumPy reader (:func:`shared_data.data.crop_readers.make_batch`)
for the same plan: crops start where :mod:`shared_data.data.sampler` says and the symmetry comes from the
one table in :mod:`shared_data.data.symmetry`, applied by DALI operators on the pipeline's device
(GPU when there is one) as what it is, a signed permutation of the channels, an axis permutation
and flips, each value copied or negated exactly (bit for bit, signed zeros included):

    channels (channel-first): fn.sequence_rearrange (per-sample channel order, the vector components
    turning with the grid)  ->  x * sign (per-sample, per-channel +-1)
    axes: fn.transpose (one of the six axis orders per sample, picked by DALI's conditional
    execution; the same pass makes channel-first data DHWC)  ->  fn.flip (per-sample depthwise /
    vertical / horizontal).

For ``dali-device`` the framework's crop function applies the channel part while it cuts (a gather of
the source channels times their signs, no extra pass), and DALI does the axes.

Per-step symmetry parameters and crop starts enter through named external sources (``PARAMS``). The
JAX side attaches a Python callback (:class:`PlanSource`); the TF side feeds the same names from
``tf.data`` datasets (``DALIDatasetWithInputs``), because the TF plugin runs callbacks only as
non-parallel generators.

* ``dali-npy``: ``fn.readers.numpy`` reads just the ROI of the DHWC ``.npy`` files
  (``python -m shared_data.data.convert``).
* ``dali-h5``: ``fn.external_source`` reads crops straight from the HDF5 file, channel-first, and
  ``fn.transpose`` makes them DHWC. ``dali_h5_mode`` chooses how:
  ``parallel`` (per-sample callback in ``py_num_workers`` spawned worker processes, each opening the
  file once; DALI passes the shared-memory buffers without a copy), ``prefetch`` (batch callback in
  this process, a ``concurrent.futures`` thread reading the next batch while DALI works on this one,
  returned with ``no_copy=True`` from a ring of buffers deeper than DALI's prefetch queue) or
  ``simple`` (batch callback, copied, no prefetch: the baseline the other two are measured against).
* ``dali-device``: the two volumes are read once into the memory of the pipeline's device (GPU
  memory on a GPU, host memory otherwise; channel-first as in the HDF5 file) and the framework cuts
  each step's crops there (a jitted gather in JAX; NumPy slicing for CPU pipelines and in TF, whose
  crops then move to the GPU like ``dali-h5``'s), handing DALI one (B, C, s, s, s) array per volume
  and step through ``fn.external_source(device=..., no_copy=True)``; DALI then transposes and
  augments as for ``dali-h5``. With JAX on a GPU the host does no per-voxel work. Memory: the whole
  volume per device (38.6 GB for the tutorial's 1024^3 x 9 channels, which fits an H200).
  (Feeding DALI the whole volume once per sample and cutting with ``fn.slice`` does not work on a
  GPU: DALI packs GPU input batches contiguously, B copies of the volume: measured, experiments/perf_notes.md.)
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import itertools
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_data.core import loader_kinds
from shared_data.core.config import Config
from shared_data.core.config_schema import CHOICES
from shared_data.core.errors import MissingDependencyError
from shared_data.data import dataset, host_batches, symmetry
from shared_data.data.crop_readers import H5LowMemReader

log = logging.getLogger(__name__)

PARAMS = ("roi_start", "axis_order", "flip_d", "flip_h", "flip_w", "src_in", "sign_in", "src_out", "sign_out", "mask")
AXIS_ORDERS = tuple(itertools.permutations(range(3)))  # spatial axis orders; index = ``axis_order``
OUTPUTS = ("inputs", "targets", "mask")
H5_MODES = CHOICES["dali_h5_mode"]


def param_names(kind: str) -> tuple[str, ...]:
    """The :data:`PARAMS` a pipeline of loader ``kind`` reads: ``roi_start`` only for DALI's own
    reader, the channel tables only where DALI applies the channel part (not ``dali-device``)."""
    k = loader_kinds.loader_kind(kind)
    skip = {"roi_start"} if k.crops_outside_dali else set()
    if k.device_volumes:
        skip |= {"src_in", "sign_in", "src_out", "sign_out"}
    return tuple(p for p in PARAMS if p not in skip)


def require_dali():
    """Import DALI or raise :class:`MissingDependencyError` naming the extra to install."""
    try:
        import nvidia.dali
    except ImportError:
        raise MissingDependencyError(
            "the DALI loaders need NVIDIA DALI: pip install -e '.[dali]' (CUDA 13; '.[dali-cuda12]' for CUDA 12)"
        ) from None
    return nvidia.dali


@functools.cache
def _symmetry_tables(n_in: int, n_out: int, vec_in: tuple, vec_out: tuple):
    perms, signs, src_in, sign_in = symmetry.gather_tables(n_in, vec_in)
    _, _, src_out, sign_out = symmetry.gather_tables(n_out, vec_out)
    order = np.array([AXIS_ORDERS.index(tuple(p)) for p in perms], np.int32)
    flips = (signs < 0).astype(np.int32)  # (48, 3): flip output axis D, H, W
    return order, flips, src_in, sign_in, src_out, sign_out


def channel_tables(cfg: Config, key: str) -> tuple[np.ndarray, np.ndarray]:
    """The channel part of the 48 symmetries for volume ``key`` (``Nbody`` / ``Hydro``): source
    channel ``src`` int32 (48, C) and sign float32 (48, C) of each output channel
    (:func:`shared_data.data.symmetry.gather_tables`)."""
    n, vectors = (
        (cfg.N_in_channels, cfg.nbody_vector_channels)
        if key == "Nbody"
        else (cfg.N_out_channels, cfg.hydro_vector_channels)
    )
    return symmetry.gather_tables(n, vectors)[2:]


def step_params(draws, mask: np.ndarray, cfg: Config) -> dict[str, np.ndarray]:
    """Per-sample pipeline inputs of one step: ``roi_start`` int32 (B, 3); ``axis_order`` int32 (B,),
    the index in :data:`AXIS_ORDERS` of the symmetry's axis permutation (output axis i is input
    spatial axis ``perm[i]``); ``flip_d``, ``flip_h``, ``flip_w`` int32 (B,), 1 where that output
    axis is reversed (``sign[i] < 0``); ``src_in`` int32 (B, N_in) and ``sign_in`` float32
    (B, N_in) (and ``src_out``, ``sign_out`` for N_out): each output channel's source channel and
    sign (:func:`channel_tables`); ``mask`` float32 (B,)."""
    order, flips, src_in, sign_in, src_out, sign_out = _symmetry_tables(
        cfg.N_in_channels, cfg.N_out_channels, cfg.nbody_vector_channels, cfg.hydro_vector_channels
    )
    g = draws.symmetries
    return {
        "roi_start": draws.starts.astype(np.int32),
        "axis_order": order[g],
        "flip_d": flips[g, 0],
        "flip_h": flips[g, 1],
        "flip_w": flips[g, 2],
        "src_in": src_in[g],
        "sign_in": sign_in[g],
        "src_out": src_out[g],
        "sign_out": sign_out[g],
        "mask": np.asarray(mask, np.float32),
    }


def plan_params(plan: host_batches.EpochPlan, cfg: Config) -> dict[str, np.ndarray]:
    """``step_params`` of every step stacked on a leading step axis (the TF input datasets), for
    the parameters ``cfg.data_loader_config``'s pipeline reads."""
    per_step = [step_params(d, m, cfg) for d, m in zip(plan.draws, plan.masks)]
    return {k: np.stack([p[k] for p in per_step]) for k in param_names(cfg.data_loader_config)}


class EpochPlans:
    """Plans of one split for one set of shards, by epoch (cached); picklable for DALI workers."""

    def __init__(
        self, cfg: Config, split: int, shards: Sequence[int], replicas: int, volume_size: int, epoch_offset: int = 0
    ):
        self.cfg, self.split, self.shards, self.replicas, self.size = cfg, split, list(shards), replicas, volume_size
        self.epoch_offset = epoch_offset
        self._cache: dict[int, host_batches.EpochPlan] = {}

    def __call__(self, epoch_idx: int) -> host_batches.EpochPlan:
        epoch = 0 if self.split == host_batches.VAL else self.epoch_offset + epoch_idx
        if epoch not in self._cache:
            self._cache = {
                epoch: host_batches.make_plan(self.cfg, self.split, epoch, self.shards, self.replicas, self.size)
            }
        return self._cache[epoch]


class PlanSource:
    """Batch callback giving the parameters ``names`` of each step (``batch_info=True``); StopIteration
    ends an epoch."""

    def __init__(self, plans: EpochPlans, names: Sequence[str]):
        self.plans, self.names = plans, tuple(names)

    def __call__(self, info):
        plan = self.plans(info.epoch_idx)
        if info.iteration >= len(plan):
            raise StopIteration
        p = step_params(plan.draws[info.iteration], plan.masks[info.iteration], self.plans.cfg)
        return tuple(p[k] for k in self.names)


class H5CropSource:
    """Reads the crops of one HDF5 dataset (``key`` = ``Nbody`` or ``Hydro``) for DALI, channel-first
    (C, s, s, s) float32.

    ``mode="parallel"``: per-sample callback (``SampleInfo``), run in DALI's worker processes; the
    file opens lazily once per worker. ``"prefetch"``: batch callback (``BatchInfo``) whose next
    batch is read by a background thread, returned from a ring of ``ring`` preallocated buffers
    (pass ``no_copy=True``). ``"simple"``: batch callback, fresh arrays, no prefetch.
    """

    def __init__(self, plans: EpochPlans, path: str | Path, key: str, channels: int, mode: str, ring: int):
        if mode not in H5_MODES:
            raise ValueError(f"dali_h5_mode {mode!r}: expected one of {H5_MODES}")
        self.plans, self.key, self.channels, self.mode, self.ring = plans, key, channels, mode, ring
        cfg = plans.cfg
        self.reader = H5LowMemReader(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
        self.batch = len(plans(0).masks[0])
        self._pool: cf.ThreadPoolExecutor | None = None
        self._pending: dict = {}
        self._buffers: np.ndarray | None = None
        self._next_slot = 0
        self._parent = os.getpid()

    @property
    def no_copy(self) -> bool:
        """Whether DALI may take the returned batches without copying (the ``prefetch`` ring)."""
        return self.mode == "prefetch"

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_pool"], state["_pending"], state["_buffers"] = None, {}, None
        return state

    def __setstate__(self, state):
        """Unpickled in one of DALI's worker processes (``parallel``), the source makes the process
        leave SIGINT and SIGTERM to the pipeline's process and end with it
        (:func:`shared_data.data.crop_workers.serve_parent`): a signal to the process group then
        stops the run in one line instead of killing the workers under DALI, and a kill -9 of
        the run leaves no worker behind."""
        self.__dict__.update(state)
        if os.getpid() != self._parent:
            from shared_data.data.crop_workers import serve_parent

            serve_parent(self._parent)

    def _shape(self) -> tuple:
        s = self.plans.cfg.crop_size
        return (self.channels, s, s, s)

    def _read_batch(self, plan, step: int, out: np.ndarray) -> np.ndarray:
        for i, start in enumerate(plan.draws[step].starts):
            self.reader.read_one(self.key, start, out[i])
        return out

    def __call__(self, info):
        if self.mode == "parallel":  # SampleInfo
            plan = self.plans(info.epoch_idx)
            step, i = divmod(info.idx_in_epoch, self.batch)
            if step >= len(plan):
                raise StopIteration
            out = np.empty(self._shape(), np.float32)
            self.reader.read_one(self.key, plan.draws[step].starts[i], out)
            return out
        plan = self.plans(info.epoch_idx)
        if info.iteration >= len(plan):
            raise StopIteration
        if self.mode == "simple":
            return self._read_batch(plan, info.iteration, np.empty((self.batch, *self._shape()), np.float32))
        return self._prefetched(plan, info)

    def _prefetched(self, plan, info) -> np.ndarray:
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix=f"h5-{self.key}")
            self._buffers = np.empty((self.ring, self.batch, *self._shape()), np.float32)
        key = (info.epoch_idx, info.iteration)
        future = self._pending.pop(key, None) or self._submit(plan, info.iteration)
        out = future.result()
        if info.iteration + 1 < len(plan):
            self._pending[(info.epoch_idx, info.iteration + 1)] = self._submit(plan, info.iteration + 1)
        return out

    def _submit(self, plan, step: int) -> cf.Future:
        buf = self._buffers[self._next_slot]
        self._next_slot = (self._next_slot + 1) % self.ring
        return self._pool.submit(self._read_batch, plan, step, buf)


def _param_nodes(fn, kind: str, plans: EpochPlans | None) -> dict:
    """External sources for the parameters of ``kind``: a :class:`PlanSource` callback when
    ``plans`` is given (JAX), else bare named inputs fed by the framework (TF's ``input_datasets``).

    The named inputs are copied into DALI's own memory first: fed straight from ``tf.data``, the
    values that ``fn.sequence_rearrange`` and the channel-sign product read as argument inputs
    come out overwritten (tests/test_dali.py shows it), a few bytes per sample to copy."""
    names = param_names(kind)
    if plans is None:
        return {name: fn.copy(fn.external_source(name=name)) for name in names}
    outs = fn.external_source(source=PlanSource(plans, names), num_outputs=len(names), batch=True, batch_info=True)
    return dict(zip(names, outs))


def permute_axes(fn, x, order, channel_first: bool):
    """``x`` (CDHW if ``channel_first``, else DHWC) with its spatial axes in the per-sample order
    ``order`` (an index into :data:`AXIS_ORDERS`), as DHWC: one ``fn.transpose`` per branch of DALI's
    conditional execution, each run on just the samples of its order."""
    c, first = (0, 1) if channel_first else (3, 0)
    perms = [[first + a for a in axes] + [c] for axes in AXIS_ORDERS]
    # DALI's conditionals turn ``if`` statements on per-sample predicates into a split and merge of
    # the batch, so the six orders are written out as six branches
    if order == 0:
        out = fn.transpose(x, perm=perms[0], output_layout="DHWC")
    elif order == 1:
        out = fn.transpose(x, perm=perms[1], output_layout="DHWC")
    elif order == 2:
        out = fn.transpose(x, perm=perms[2], output_layout="DHWC")
    elif order == 3:
        out = fn.transpose(x, perm=perms[3], output_layout="DHWC")
    elif order == 4:
        out = fn.transpose(x, perm=perms[4], output_layout="DHWC")
    else:
        out = fn.transpose(x, perm=perms[5], output_layout="DHWC")
    return out


def map_channels(fn, x, src, sign):
    """Channel-first ``x`` with output channel d = ``sign[d] * x[src[d]]`` per sample (exact)."""
    sign = fn.reshape(sign, shape=[-1, 1, 1, 1])  # (C,) -> (C, 1, 1, 1): broadcast over the voxels
    return fn.sequence_rearrange(fn.reshape(x, layout="FDHW"), new_order=src) * sign


def _augment(fn, x, params: dict, key: str, layout: str):
    """The symmetry of each sample on ``x``, as DHWC. ``layout``: ``"DHWC"`` (the numpy reader's ROIs),
    ``"CDHW"`` (crops made outside DALI) or ``"CDHW mapped"`` (crops whose channels the crop
    function has already mapped)."""
    if layout == "DHWC":
        x = fn.transpose(x, perm=[3, 0, 1, 2])
    if layout != "CDHW mapped":
        io = "in" if key == "Nbody" else "out"
        x = map_channels(fn, x, params[f"src_{io}"], params[f"sign_{io}"])
    x = permute_axes(fn, x, params["axis_order"], channel_first=True)
    return fn.flip(x, depthwise=params["flip_d"], vertical=params["flip_h"], horizontal=params["flip_w"])


def build_pipeline(
    cfg: Config,
    split: str,
    batch_size: int,
    device_id: int | None,
    plans: EpochPlans | None = None,
    crop_sources: dict | None = None,
):
    """A DALI pipeline of ``cfg.data_loader_config`` (``dali-npy`` / ``dali-lowmem`` / ``dali-h5`` /
    ``dali-device``) for ``split`` (``"train"`` / ``"val"``; the ``.npy`` twins of the numpy reader
    are ``cfg.npy_files(split)``). ``device_id=None`` runs it CPU-only.

    ``plans`` given: parameters come from a callback; else from named inputs (TF). For ``dali-h5`` and
    ``dali-device`` ``crop_sources`` maps ``Nbody``/``Hydro`` to batch callbacks giving each step's
    channel-first crops (:class:`H5CropSource`, :class:`DeviceCropSource`; for ``dali-device`` arrays
    on the pipeline's device), or is None for named inputs ``Nbody``/``Hydro`` (TF).
    Outputs: ``inputs``, ``targets`` (DHWC), ``mask``.

    Raises:
        MissingDependencyError: DALI is not installed.
    """
    dali = require_dali()
    from nvidia.dali import fn

    kind = cfg.data_loader_config
    s, device = cfg.crop_size, "gpu" if device_id is not None else "cpu"
    parallel = kind == "dali-h5" and cfg.dali_h5_mode == "parallel" and crop_sources is not None
    kwargs = dict(
        batch_size=batch_size,
        num_threads=cfg.dali_threads,
        device_id=device_id,
        prefetch_queue_depth=cfg.dali_prefetch_queue_depth,
        exec_dynamic=True,
    )
    if parallel:
        kwargs.update(py_num_workers=cfg.num_data_workers, py_start_method="spawn")
    npy = cfg.npy_files(split) if loader_kinds.loader_kind(kind).reads_npy else None
    on_device = loader_kinds.loader_kind(kind).device_volumes and crop_sources is not None
    source_device = device if on_device else "cpu"  # where the crops are

    @dali.pipeline_def(enable_conditionals=True, **kwargs)
    def pipeline():
        params = _param_nodes(fn, kind, plans)
        if npy:
            # one file read ROI by ROI: cache its header instead of parsing it per sample
            roi = dict(
                roi_start=params["roi_start"],
                roi_shape=[s, s, s],
                roi_axes=[0, 1, 2],
                cache_header_information=True,
                prefetch_queue_depth=cfg.dali_prefetch_queue_depth,
            )
            nb = fn.readers.numpy(files=[str(npy[0])], name="nbody_reader", **roi)
            hy = fn.readers.numpy(files=[str(npy[1])], name="hydro_reader", **roi)
        else:  # crops made outside DALI: on the host, or on the pipeline's device by dali-device callbacks
            nb, hy = (_crop_node(fn, crop_sources, key, parallel, source_device) for key in dataset.KEYS)
        if device == "gpu" and source_device == "cpu":
            nb, hy = nb.gpu(), hy.gpu()
        mask = params["mask"].gpu() if device == "gpu" else params["mask"]  # all outputs on one device
        layout = "DHWC" if npy else "CDHW mapped" if loader_kinds.loader_kind(kind).device_volumes else "CDHW"
        return _augment(fn, nb, params, "Nbody", layout), _augment(fn, hy, params, "Hydro", layout), mask

    pipe = pipeline()
    if parallel:  # the workers start here, with the run's signals blocked (crop_workers.workers_started)
        from shared_data.data.crop_workers import workers_started

        with workers_started():
            pipe.start_py_workers()
    return pipe


def load_volumes(path: str | Path, cfg: Config) -> dict[str, np.ndarray]:
    """The ``dali-device`` volumes in host memory: ``{"Nbody": (N_in, L, L, L), "Hydro": (N_out, L, L, L)}``
    float32, checked by :class:`shared_data.data.crop_readers.InMemReader` (raises its ``DatasetError``)."""
    from shared_data.data.crop_readers import InMemReader

    reader = InMemReader(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
    return dict(zip(dataset.KEYS, reader.volumes()))


def numpy_crops(
    volume: np.ndarray,
    starts: np.ndarray,
    src: np.ndarray | None = None,
    sign: np.ndarray | None = None,
    *,
    size: int,
) -> np.ndarray:
    """(B, C, s, s, s) crops of a channel-first (C, L, L, L) ``volume`` at ``starts`` (B, 3); with
    ``src`` int (B, C) and ``sign`` float32 (B, C), output channel d of sample b is
    ``sign[b, d] * volume[src[b, d]]`` (the channel part of the symmetry, exact). The host form of
    a ``dali-device`` crop function."""
    crops = np.stack([volume[:, x : x + size, y : y + size, z : z + size] for x, y, z in np.asarray(starts)])
    if src is None:
        return crops
    mapped = np.take_along_axis(crops, np.asarray(src)[:, :, None, None, None], axis=1)
    return mapped * np.asarray(sign, np.float32)[:, :, None, None, None]


class DeviceCropSource:
    """``dali-device`` batch callback (``batch_info=True``) for one volume: the step's (B, C, s, s, s)
    crops with their channels mapped (:func:`numpy_crops`), arrays on the pipeline's device.

    ``crop_fn(starts, src, sign)`` takes the draws of ``k`` steps at once ((k, B, 3), (k, B, C),
    (k, B, C)) and returns ``k`` arrays that are complete when returned: the crops of
    ``dali_device_cut_steps`` steps are cut in one call, so the host waits for the device (whose
    queue holds the training steps already dispatched) once per that many steps, not every step.
    The results handed to DALI stay referenced for ``ring`` more steps, deeper than DALI's prefetch
    queue, so a ``no_copy`` buffer is never freed while DALI may still read it."""

    no_copy = True  # the ring keeps each result alive

    def __init__(self, plans: EpochPlans, crop_fn, ring: int, key: str, cut_steps: int):
        self.plans, self.crop_fn, self.cut_steps = plans, crop_fn, cut_steps
        self.src, self.sign = channel_tables(plans.cfg, key)
        self._ring: list = [None] * ring
        self._slot = 0
        self._cut: dict = {}

    def __call__(self, info):
        plan = self.plans(info.epoch_idx)
        i = info.iteration
        if i >= len(plan):
            raise StopIteration
        if (info.epoch_idx, i) not in self._cut:
            steps = range(i, min(i + self.cut_steps, len(plan)))
            g = np.stack([plan.draws[j].symmetries for j in steps])
            starts = np.stack([plan.draws[j].starts for j in steps]).astype(np.int32)
            crops = self.crop_fn(starts, self.src[g], self.sign[g])
            self._cut = {(info.epoch_idx, j): c for j, c in zip(steps, crops)}
        out = self._cut.pop((info.epoch_idx, i))
        self._ring[self._slot] = out
        self._slot = (self._slot + 1) % len(self._ring)
        return out


def numpy_step_crops(volume: np.ndarray, starts: np.ndarray, src: np.ndarray, sign: np.ndarray, *, size: int) -> list:
    """:func:`numpy_crops` of ``k`` steps at once (the host form of a :class:`DeviceCropSource` crop
    function): ``starts`` (k, B, 3), ``src`` (k, B, C), ``sign`` (k, B, C) -> ``k`` (B, C, s, s, s) arrays."""
    return [numpy_crops(volume, st, sr, sg, size=size) for st, sr, sg in zip(starts, src, sign)]


def device_crop_sources(plans: EpochPlans, crop_fns: dict, cfg: Config) -> dict:
    """:class:`DeviceCropSource` callbacks for ``Nbody`` and ``Hydro`` from ``crop_fns`` (by key)."""
    ring = cfg.dali_prefetch_queue_depth + 2
    return {key: DeviceCropSource(plans, crop_fns[key], ring, key, cfg.dali_device_cut_steps) for key in dataset.KEYS}


def _crop_node(fn, crop_sources: dict | None, key: str, parallel: bool, device: str):
    """The external source of ``key``'s crops: a named input (``crop_sources`` None, TF; copied into
    DALI's memory like the parameters, see :func:`_param_nodes`), per-sample parallel workers, or a
    batch callback on ``device``, without a copy where the source says so."""
    if crop_sources is None:
        return fn.copy(fn.external_source(name=key))
    src = crop_sources[key]
    if parallel:
        return fn.external_source(source=src, batch=False, parallel=True)
    return fn.external_source(source=src, batch=True, batch_info=True, no_copy=src.no_copy, device=device)


def crop_sources(plans: EpochPlans, path: str | Path, cfg: Config) -> dict:
    """:class:`H5CropSource` callbacks for ``Nbody`` and ``Hydro`` in ``cfg.dali_h5_mode``; the
    ring is two deeper than DALI's prefetch queue, so a buffer is rewritten only after DALI let go."""
    ring = cfg.dali_prefetch_queue_depth + 2
    return {
        key: H5CropSource(plans, path, key, n, cfg.dali_h5_mode, ring)
        for key, n in zip(dataset.KEYS, (cfg.N_in_channels, cfg.N_out_channels))
    }
