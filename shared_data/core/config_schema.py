"""The run configuration's schema: the frozen dataclass :class:`Config`, one field per YAML key with
its type, the allowed values of the string keys (:data:`CHOICES`) and the field tables the loader
checks a section against (:data:`FIELDS`, :data:`FIELD_TYPES`).

This module only describes a config. Checking values and building a :class:`Config`
(:mod:`shared_data.core.config_checks`), reading YAML (:mod:`shared_data.core.config`), the
tutorial's format (:mod:`shared_data.core.tutorial_yaml`) and the command line
(:mod:`shared_data.core.config_cli`) build on it; it imports none of them.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

from shared_data.core.loader_kinds import NAMES as LOADERS

#: The allowed values of each string key, in the order that error messages and ``--help`` list them.
CHOICES: dict[str, tuple[str, ...]] = {
    "data_loader_config": LOADERS,
    "symmetry_group": ("cube48", "rotations24", "none"),
    "lr_scaling": ("none", "sqrt", "linear"),
    "lr_schedule": ("cosine", "constant"),
    "amp_dtype": ("bfloat16", "float16"),
    "upconv": ("subpixel", "subpixel_crop", "phases", "transpose"),
    "downconv": ("space_to_depth", "strided"),
    "conv_pad": ("separate", "folded"),
    "kernel_regroup": ("gather", "transpose"),
    "skip_concat": ("concat", "split"),
    "adam_update": ("per_tensor", "flat"),
    "dali_h5_mode": ("parallel", "prefetch", "simple"),
    "grad_allreduce_dtype": ("float32", "bfloat16"),
    "loss_space": ("log", "physical"),
    "loss_norm": ("l1", "l2"),
    "fourier_channels": ("all", "scored"),
}


@dataclasses.dataclass(frozen=True)
class Config:
    """All settings of a run. Field names follow the NERSC tutorial's ``UNet.yaml`` where it has one.

    Relative paths resolve against the current folder (data paths against ``data_dir`` when set).
    Sizes are in voxels, batch sizes in samples, learning rates per step, ``warmup_steps`` in
    optimizer steps. The fields' order is the order of :func:`~shared_data.core.config.config_dict`
    (``run.json``, logs) and the order in which loading checks them; the ``base`` section of
    ``configs/UNet.yaml`` gives each key's default and, where its name does not say it, its meaning.
    """

    # --- data: the volumes, the crops drawn from them and what their channels mean --------------
    train_path: str
    val_path: str
    data_dir: str | None
    train_path_npy_data: str | None
    train_path_npy_label: str | None
    val_path_npy_data: str | None
    val_path_npy_label: str | None
    data_loader_config: str
    num_data_workers: int
    crop_size: int
    Nsamples: int
    Nsamples_val: int
    symmetry_group: str
    nbody_vector_channels: tuple[tuple[int, ...], ...]
    hydro_vector_channels: tuple[tuple[int, ...], ...]
    density_channel: int
    density_scale: float
    temperature_channel: int
    temperature_scale: float
    seed: int
    # --- input pipeline: the synthetic loader's volume and DALI's settings -----------------------
    synthetic_volume_size: int
    dali_threads: int
    dali_prefetch_queue_depth: int
    dali_device_cut_steps: int
    dali_h5_mode: str
    # --- model: the U-Net's shape and the forms its layers are computed in ---------------------
    N_in_channels: int
    N_out_channels: int
    unet_widths: tuple[int, ...]
    full_scale: bool
    upconv: str
    downconv: str
    upconv_transpose_below: int
    downconv_strided_below: int
    conv_pad: str
    kernel_regroup: str
    skip_concat: str
    pad_out_channels: int
    # --- training: epochs, batch, learning-rate schedule and its scaling, loss, weight average ---
    num_epochs: int
    global_batch_size: int
    local_batch_size: int | None
    start_lr: float
    end_lr: float
    lr_schedule: str
    lr_scaling: str
    base_batch_size: int
    warmup_steps: int
    lambda_rho: float
    lambda_fourier: float
    fourier_channels: str
    loss_space: str
    loss_norm: str
    ema_decay: float
    # --- precision and compilation: AMP, XLA, the gradient all-reduce's dtype, the Adam update ---
    enable_amp: bool
    amp_dtype: str
    enable_jit: bool
    grad_allreduce_dtype: str
    adam_update: str
    loss_scale_init: float
    loss_scale_period: int
    # --- run and records: the run folder, checkpoints, logs, the XLA cache ----------------------
    exp_dir: str
    keep_checkpoints: int
    tensorboard: bool
    progress_bar: bool
    xla_cache_dir: str
    # --- profiling: the NVTX capture window ------------------------------------------------------
    profile_steps: tuple[int, ...] | None
    enable_manual_profiling: bool
    # --- time to quality (shared_data.inference.quality) ----------------------------------------
    quality_every_epochs: int
    quality_r_min: float
    quality_ratio_tol: float
    quality_temperature_r_min: float | None
    quality_temperature_ratio_tol: float | None
    quality_k_max: float
    quality_beat_baseline: bool
    quality_beat_non_ml: bool
    quality_density_beat_non_ml: bool | None
    quality_budget_sec: float
    # --- bookkeeping (not YAML keys) ---------------------------------------------------------
    name: str = "?"
    source: str = "?"
    notes: tuple[str, ...] = ()

    def resolve_path(self, path: str) -> Path:
        """``path`` made absolute against the current folder (``~`` expanded; absolute paths unchanged)."""
        return Path(os.path.expanduser(path)).absolute()

    def _data_path(self, path: str) -> Path:
        p = Path(os.path.expanduser(path))
        if self.data_dir and not p.is_absolute():
            p = Path(os.path.expanduser(self.data_dir)) / p
        return p.absolute()

    def data_file(self, split: str) -> Path:
        """The HDF5 file of ``split`` (``"train"`` or ``"val"``), absolute."""
        return self._data_path(self.train_path if split == "train" else self.val_path)

    def npy_files(self, split: str) -> tuple[Path, Path]:
        """The DHWC ``.npy`` twins (Nbody, Hydro) that DALI's numpy reader reads for ``split``: the
        ``*_path_npy_data`` / ``*_path_npy_label`` keys when set, else ``<stem>_Nbody.npy`` /
        ``<stem>_Hydro.npy`` beside the HDF5 file."""
        data, label = (getattr(self, f"{split}_path_npy_{k}") for k in ("data", "label"))
        h5 = self.data_file(split)
        stem = h5.with_suffix("")
        return (
            self._data_path(data) if data else Path(f"{stem}_Nbody.npy"),
            self._data_path(label) if label else Path(f"{stem}_Hydro.npy"),
        )

    def data_inputs(self) -> dict[str, Path]:
        """Every data file a run of this config may read, keyed by how the user names it: the
        training and validation volumes and their ``.npy`` twins (:meth:`npy_files`)."""
        inputs = {}
        for split in ("train", "val"):
            inputs[f"{split}_path"] = self.data_file(split)
            for key, npy in zip(("Nbody", "Hydro"), self.npy_files(split)):
                inputs[f"the {key} .npy twin of {split}_path"] = npy
        return inputs

    @property
    def precision(self) -> str:
        """``"float32"`` when AMP is off, else ``amp_dtype`` (``"bfloat16"`` or ``"float16"``)."""
        return self.amp_dtype if self.enable_amp else "float32"


_BOOKKEEPING = {"name", "source", "notes"}
#: The YAML keys, in :class:`Config`'s order: key -> its dataclass field (the bookkeeping fields
#: ``name``, ``source`` and ``notes`` are not keys).
FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(Config) if f.name not in _BOOKKEEPING}
#: The type of each YAML key as a resolved hint (``int``, ``float | None``, ``tuple[int, ...]``, ...),
#: the form :func:`~shared_data.core.config_checks.coerce` checks values against.
FIELD_TYPES: dict[str, Any] = {k: tp for k, tp in typing.get_type_hints(Config).items() if k in FIELDS}
