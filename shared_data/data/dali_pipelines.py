"""DALI pipelines shared unchanged by TF and JAX: ``dali-npy`` (alias ``dali-lowmem``), ``dali-h5`` and
``dali-device``.

Both produce, per step, ``inputs`` (B, s, s, s, N_in), ``targets`` (B, s, s, s, N_out) float32 NDHWC
and ``mask`` (B,), exactly the samples of the NumPy reader (:func:`shared_data.data.crop_readers.make_batch`)
for the same plan: crops start where :mod:`shared_data.data.sampler` says and the symmetry comes from the
one table in :mod:`shared_data.data.symmetry`, applied by DALI operators on the pipeline's device
(GPU when there is one) as what it is, a signed permutation of the channels and one of the voxels,
each value copied or negated exactly (bit for bit, signed zeros included):

    channels (channel-first): fn.sequence_rearrange (per-sample channel order, the vector components
    turning with the grid)  ->  x * sign (per-sample, per-channel +-1)  ->  fn.transpose to DHWC
    voxels (DHWC): fn.warp_affine, nearest neighbour, with a per-sample 3 x 4 matrix
    (:func:`warp_tables`) that takes every voxel centre to a voxel centre: the symmetry's axis order
    and flips in one pass.

DALI's per-sample channel gather reorders the outermost axis only, so the numpy reader's DHWC ROIs
are made channel-first for the channel part and DHWC again for the warp. For ``dali-device`` the
framework's crop function applies the channel part while it cuts (a gather of the source channels
times their signs, written DHWC in the same pass), and DALI only warps.

Per-step parameters (crop starts, warp matrices, channel tables) enter through named external
sources (``PARAMS``). The JAX side attaches a Python callback (:class:`PlanSource`); the TF side
feeds the same names from ``tf.data`` datasets (``DALIDatasetWithInputs``), because the TF plugin
runs callbacks only as non-parallel generators.

* ``dali-npy``: ``fn.readers.numpy`` reads just the ROI of the DHWC ``.npy`` files
  (``python -m shared_data.data.convert``).
* ``dali-h5``: ``fn.external_source`` reads crops straight from the HDF5 file, channel-first.
  ``dali_h5_mode`` chooses how:
  ``parallel`` (per-sample callback in ``py_num_workers`` spawned worker processes, each opening the
  file once; DALI passes the shared-memory buffers without a copy), ``prefetch`` (batch callback in
  this process, a ``concurrent.futures`` thread reading the next batch while DALI works on this one,
  returned with ``no_copy=True`` from a ring of buffers deeper than DALI's prefetch queue) or
  ``simple`` (batch callback, copied, no prefetch: the baseline the other two are measured against).
* ``dali-device``: the two volumes are read once into the memory of the pipeline's device (GPU
  memory on a GPU, host memory otherwise; channel-first as in the HDF5 file) and the framework cuts
  each step's crops there (a jitted gather in JAX; NumPy slicing for CPU pipelines and in TF, whose
  crops then move to the GPU like ``dali-h5``'s), handing DALI one (B, s, s, s, C) DHWC array per
  volume and step, channels mapped, through ``fn.external_source(device=..., no_copy=True)``; DALI
  then warps it. With JAX on a GPU the host does no per-voxel work. Memory: the whole volume per
  device (38.6 GB for the tutorial's 1024^3 x 9 channels, which fits an H200).
  (Feeding DALI the whole volume once per sample and cutting with ``fn.slice`` does not work on a
  GPU: DALI packs GPU input batches contiguously, B copies of the volume: experiments/perf_notes.md.)
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
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

PARAMS = ("roi_start", "warp", "src_in", "sign_in", "src_out", "sign_out", "mask")
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
def warp_tables(crop: int) -> np.ndarray:
    """(48, 3, 4) float32: for each symmetry the affine map that ``fn.warp_affine`` (with
    ``inverse_map=False``) applies to a DHWC crop of side ``crop``.

    From the table of :mod:`shared_data.data.symmetry` (``perm``, ``sign``): output voxel y (D, H, W
    order) reads input voxel w with ``w[perm[i]] = y_i``, or ``crop - 1 - y_i`` where ``sign[i] < 0``,
    i.e. at voxel centres (index + 0.5) ``w_c[perm[i]] = sign[i] * y_c_i + (crop if sign[i] < 0 else
    0)``. DALI's coordinates are (x, y, z) = (W, H, D), the reverse of the array's axes, and with
    ``inverse_map=False`` it takes the map from source to destination, so the table holds the inverse
    of that destination-to-source map: exact, a signed permutation and whole-number shifts, and every
    output centre lands on an input centre, which nearest-neighbour sampling copies unchanged."""
    perms, signs = symmetry.gather_tables(1, ())[:2]
    out = np.zeros((len(perms), 3, 4), np.float32)
    r = lambda axis: 2 - axis  # D, H, W -> DALI's z, y, x
    for g, (perm, sign) in enumerate(zip(perms, signs)):
        m = np.eye(4)
        m[:3, :3] = 0
        for i in range(3):
            m[r(perm[i]), r(i)] = sign[i]
            m[r(perm[i]), 3] = crop if sign[i] < 0 else 0
        out[g] = np.linalg.inv(m)[:3]
    out.setflags(write=False)
    return out


@functools.cache
def _channel_tables(n: int, vectors: tuple) -> tuple[np.ndarray, np.ndarray]:
    src, sign = symmetry.gather_tables(n, vectors)[2:]
    src.setflags(write=False)
    sign.setflags(write=False)
    return src, sign


def channel_tables(cfg: Config, key: str) -> tuple[np.ndarray, np.ndarray]:
    """The channel part of the 48 symmetries for volume ``key`` (``Nbody`` / ``Hydro``): source
    channel ``src`` int32 (48, C) and sign float32 (48, C) of each output channel
    (:func:`shared_data.data.symmetry.gather_tables`)."""
    n, vectors = (
        (cfg.N_in_channels, cfg.nbody_vector_channels)
        if key == "Nbody"
        else (cfg.N_out_channels, cfg.hydro_vector_channels)
    )
    return _channel_tables(n, vectors)


def step_params(draws, mask: np.ndarray, cfg: Config) -> dict[str, np.ndarray]:
    """Per-sample pipeline inputs of one step: ``roi_start`` int32 (B, 3); ``warp`` float32
    (B, 3, 4), the symmetry's voxel map for ``fn.warp_affine`` (:func:`warp_tables`); ``src_in``
    int32 (B, N_in) and ``sign_in`` float32 (B, N_in) (and ``src_out``, ``sign_out`` for N_out):
    each output channel's source channel and sign (:func:`channel_tables`); ``mask`` float32 (B,)."""
    (src_in, sign_in), (src_out, sign_out) = (channel_tables(cfg, key) for key in dataset.KEYS)
    g = draws.symmetries
    return {
        "roi_start": draws.starts.astype(np.int32),
        "warp": warp_tables(cfg.crop_size)[g],
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


def map_channels(fn, x, src, sign):
    """Channel-first ``x`` with output channel d = ``sign[d] * x[src[d]]`` per sample (exact)."""
    sign = fn.reshape(sign, shape=[-1, 1, 1, 1])  # (C,) -> (C, 1, 1, 1): broadcast over the voxels
    return fn.sequence_rearrange(fn.reshape(x, layout="FDHW"), new_order=src) * sign


def move_voxels(fn, x, matrix):
    """DHWC ``x`` with each sample's voxels moved by its ``matrix`` (3, 4), a row of
    :func:`warp_tables`: nearest neighbour at voxel centres, each value copied (exact)."""
    from nvidia.dali import types

    return fn.warp_affine(x, matrix=matrix, inverse_map=False, interp_type=types.INTERP_NN)


def _augment(fn, x, params: dict, key: str, layout: str, mapped: bool):
    """The symmetry of each sample on ``x``, as DHWC. ``layout``: ``"DHWC"`` (the numpy reader's ROIs,
    ``dali-device``'s crops) or ``"CDHW"`` (the HDF5 crops); ``mapped``: the crop function has
    applied the channel part (``dali-device``)."""
    if not mapped:
        if layout == "DHWC":  # the channel gather reorders the outermost axis only
            x = fn.transpose(x, perm=[3, 0, 1, 2])
        io = "in" if key == "Nbody" else "out"
        x = map_channels(fn, x, params[f"src_{io}"], params[f"sign_{io}"])
        x = fn.transpose(x, perm=[1, 2, 3, 0], output_layout="DHWC")
    return move_voxels(fn, x, params["warp"])


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
    crops (:class:`H5CropSource`: channel-first; :class:`DeviceCropSource`: DHWC, channels mapped,
    arrays on the pipeline's device), or is None for named inputs ``Nbody``/``Hydro`` (TF).
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
    loader = loader_kinds.loader_kind(kind)
    npy = cfg.npy_files(split) if loader.reads_npy else None
    on_device = loader.device_volumes and crop_sources is not None
    source_device = device if on_device else "cpu"  # where the crops are
    layout = "CDHW" if loader.crops_outside_dali and not loader.device_volumes else "DHWC"  # as DALI gets them
    mapped = loader.device_volumes  # dali-device's crop functions apply the channel part

    @dali.pipeline_def(**kwargs)
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
            nb, hy = (_crop_node(fn, crop_sources, key, parallel, source_device, layout) for key in dataset.KEYS)
        if device == "gpu" and source_device == "cpu":
            nb, hy = nb.gpu(), hy.gpu()
        mask = params["mask"].gpu() if device == "gpu" else params["mask"]  # all outputs on one device
        nb, hy = (_augment(fn, x, params, key, layout, mapped) for x, key in zip((nb, hy), dataset.KEYS))
        return nb, hy, mask

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


def numpy_crops(volume: np.ndarray, starts: np.ndarray, src: np.ndarray, sign: np.ndarray, *, size: int) -> np.ndarray:
    """(B, s, s, s, C) DHWC crops of a channel-first (C, L, L, L) ``volume`` at ``starts`` (B, 3), with
    the channel part of the symmetry: output channel d of sample b is ``sign[b, d] *
    volume[src[b, d]]`` (``src`` int (B, C), ``sign`` float32 (B, C); exact). The host form of a
    ``dali-device`` crop function; C-contiguous, as DALI takes no strided arrays."""
    out = np.empty((len(starts), size, size, size, volume.shape[0]), volume.dtype)
    sign = np.asarray(sign, volume.dtype)
    for b, ((x, y, z), sr) in enumerate(zip(np.asarray(starts), np.asarray(src))):
        crop = volume[sr, x : x + size, y : y + size, z : z + size]  # (C, s, s, s), channels gathered
        np.multiply(np.moveaxis(crop, 0, -1), sign[b], out=out[b])
    return out


class DeviceCropSource:
    """``dali-device`` batch callback (``batch_info=True``) for one volume: the step's (B, s, s, s, C)
    DHWC crops with their channels mapped (:func:`numpy_crops`), arrays on the pipeline's device,
    ready for the warp.

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
    function): ``starts`` (k, B, 3), ``src`` (k, B, C), ``sign`` (k, B, C) -> ``k`` (B, s, s, s, C) arrays."""
    return [numpy_crops(volume, st, sr, sg, size=size) for st, sr, sg in zip(starts, src, sign)]


def device_crop_sources(plans: EpochPlans, crop_fns: dict, cfg: Config) -> dict:
    """:class:`DeviceCropSource` callbacks for ``Nbody`` and ``Hydro`` from ``crop_fns`` (by key)."""
    ring = cfg.dali_prefetch_queue_depth + 2
    return {key: DeviceCropSource(plans, crop_fns[key], ring, key, cfg.dali_device_cut_steps) for key in dataset.KEYS}


def _crop_node(fn, crop_sources: dict | None, key: str, parallel: bool, device: str, layout: str):
    """The external source of ``key``'s crops, of ``layout``: a named input (``crop_sources`` None,
    TF; copied into DALI's memory like the parameters, see :func:`_param_nodes`), per-sample
    parallel workers, or a batch callback on ``device``, without a copy where the source says so."""
    if crop_sources is None:
        return fn.copy(fn.external_source(name=key, layout=layout))
    src = crop_sources[key]
    if parallel:
        return fn.external_source(source=src, batch=False, parallel=True, layout=layout)
    return fn.external_source(
        source=src, batch=True, batch_info=True, no_copy=src.no_copy, device=device, layout=layout
    )


def crop_sources(plans: EpochPlans, path: str | Path, cfg: Config) -> dict:
    """:class:`H5CropSource` callbacks for ``Nbody`` and ``Hydro`` in ``cfg.dali_h5_mode``; the
    ring is two deeper than DALI's prefetch queue, so a buffer is rewritten only after DALI let go."""
    ring = cfg.dali_prefetch_queue_depth + 2
    return {
        key: H5CropSource(plans, path, key, n, cfg.dali_h5_mode, ring)
        for key, n in zip(dataset.KEYS, (cfg.N_in_channels, cfg.N_out_channels))
    }
