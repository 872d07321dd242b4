"""The input loaders a run can choose (``data_loader_config``), and what each one needs.

One registry, so code asks a loader what it is (``loader_kind(cfg).dali``) instead of comparing
names. The names are the NERSC tutorial's (``synthetic``, ``inmem``, ``lowmem``, ``dali-lowmem``)
plus this kit's (``device``, ``dali-npy``, ``dali-h5``, ``dali-device``).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoaderKind:
    """What a loader reads and where it cuts crops.

    Attributes:
        name: the ``data_loader_config`` value.
        host_reader: the host crop reader it uses (``synthetic``, ``inmem`` or ``lowmem``; see
            :func:`shared_data.data.crop_readers.make_reader`).
        dali: a DALI pipeline makes the batches.
        reads_npy: DALI's numpy reader reads the DHWC ``.npy`` twins of the HDF5 files.
        crops_outside_dali: DALI receives crops cut by the framework or an HDF5 callback.
        device_volumes: the whole volumes live in device memory.
        description: one line for help texts and logs.
    """

    name: str
    host_reader: str
    dali: bool = False
    reads_npy: bool = False
    crops_outside_dali: bool = False
    device_volumes: bool = False
    description: str = ""

    @property
    def uses_files(self) -> bool:
        """Whether the loader reads the dataset files (all but ``synthetic``)."""
        return self.host_reader != "synthetic"


KINDS: dict[str, LoaderKind] = {
    k.name: k
    for k in (
        LoaderKind("synthetic", "synthetic", description="a random volume made in memory, the real copy pattern"),
        LoaderKind("inmem", "inmem", description="both volumes in host memory, crops sliced there"),
        LoaderKind("lowmem", "lowmem", description="each crop read from the HDF5 file (h5py read_direct)"),
        LoaderKind(
            "device",
            "inmem",
            device_volumes=True,
            description="volumes in device memory, crop and symmetry by a gather inside the compiled step",
        ),
        LoaderKind("dali-npy", "lowmem", dali=True, reads_npy=True, description="DALI's numpy reader with ROI"),
        LoaderKind("dali-lowmem", "lowmem", dali=True, reads_npy=True, description="the tutorial's name of dali-npy"),
        LoaderKind(
            "dali-h5", "lowmem", dali=True, crops_outside_dali=True, description="DALI external source reading HDF5"
        ),
        LoaderKind(
            "dali-device",
            "inmem",
            dali=True,
            crops_outside_dali=True,
            device_volumes=True,
            description="volumes in device memory, crops cut by the framework, symmetry by DALI",
        ),
    )
}
NAMES = tuple(KINDS)


def loader_kind(name_or_cfg) -> LoaderKind:
    """The :class:`LoaderKind` of a name or of a config's ``data_loader_config``.

    Raises:
        KeyError: an unknown name (configs are checked against :data:`NAMES` when loaded).
    """
    name = name_or_cfg if isinstance(name_or_cfg, str) else name_or_cfg.data_loader_config
    return KINDS[name]
