"""The data: dataset contract and physics generator, cube symmetries, crop sampling and readers, DALI pipelines.

Under ``python -m shared_data.data.convert``, SIGTERM and Ctrl-C before the command's own handlers
(while numpy and h5py import) and after them (as it exits) end the process at once with one
sentence, not a traceback from inside an import or a silent exit: nothing is being written then."""

import os
import signal

from shared_data.core.commands import command_module


def _stop_outside_the_conversion(signum: int, frame=None) -> None:
    os.write(2, f"stopped by {signal.Signals(signum).name}: nothing was being converted\n".encode())
    os._exit(128 + signum)


if command_module() == f"{__name__}.convert":
    for _signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_signum, _stop_outside_the_conversion)
