"""Address space under a ``ulimit -v``: what this process may still map, and the checks that refuse a
command before its framework runs out of it where no error can be caught.

TensorFlow's runtime aborts natively when an allocation fails while it starts its thread pools or
compiles (``std::bad_alloc``, LLVM's "Unable to allocate section memory"), and a thread that JAX or
TensorStore cannot start ends in ``std::system_error`` or a failed checkpoint read. So the trainers,
``predict`` and ``export`` compare, once their framework has loaded, what the limit leaves with what
the command takes, and refuse in one line before any work. Nothing is checked without a limit.
"""

from __future__ import annotations

import errno
from pathlib import Path

from shared_data.core.errors import UserError, address_space_limit

#: Address space a trainer takes between this check and the start of its first checkpoint save,
#: besides the save's own need (:func:`shared_data.runtime.checks.save_memory_needed`): the compiler's
#: threads and JIT memory, the train state, the loader's buffers. With the malloc arenas capped
#: (:func:`shared_data.core.errors.cap_malloc_arenas`), ``cpu_tiny`` on 2 cores grew by about 280 MiB
#: (TensorFlow) and 215 MiB (JAX) from the check to its first save.
TRAIN_RESERVE_BYTES = 256 * 2**20
#: Address space ``predict`` takes after its check, besides the prediction's float32 output: the
#: checkpoint's restore (TensorStore's and orbax's threads), the compiler, the windows. With the
#: malloc arenas capped, ``cpu_tiny`` on 2 cores peaked 276 MiB (TensorFlow) and 180 MiB (JAX) above
#: the check without a limit; under one TensorFlow crashed natively with 259 MiB left, JAX with 162.
PREDICT_RESERVE_BYTES = 304 * 2**20
#: The same for ``export`` (restore and trace): peaks 152 MiB (TensorFlow) and 164 MiB (JAX);
#: TensorFlow crashed natively with 139 MiB left, JAX's restore failed with 135.
EXPORT_RESERVE_BYTES = 192 * 2**20
_FRAMEWORKS = {"tf": "TensorFlow", "jax": "JAX"}


def format_bytes(n: int) -> str:
    """``n`` bytes as ``"1.25 GiB"`` (from 1 GiB) or ``"300.0 MiB"``."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def address_space_left() -> int | None:
    """Bytes this process may still map under its ``ulimit -v`` (``RLIMIT_AS`` minus ``VmSize`` of
    ``/proc/self/status``); None without a limit or where the size cannot be read."""
    limit = address_space_limit()
    if limit is None:
        return None
    try:
        status = Path("/proc/self/status").read_text().splitlines()
        size = int(next(line for line in status if line.startswith("VmSize:")).split()[1]) * 1024
    except MemoryError:  # not even the few bytes of the file
        return 0
    except OSError as err:
        return 0 if err.errno == errno.ENOMEM else None
    except (StopIteration, ValueError, IndexError):
        return None
    return limit - size


def check_address_space(framework: str, command: str, takes: str, need: int, nothing: str) -> None:
    """Refuse ``command`` (``"train"``, ``"predict"``, ``"export"``) when the ``ulimit -v`` leaves less
    address space than ``need`` bytes, what ``takes`` (its work, in words) takes once ``framework``
    (``"tf"`` or ``"jax"``) has loaded. Nothing is checked without a limit.

    Raises:
        UserError: the limit, the address space left and needed, by how much to raise the limit, and
            ``nothing`` (what was not done).
    """
    left = address_space_left()
    if left is None or left >= need:
        return
    left = max(left, 0)
    raise UserError(
        f"cannot {command} under ulimit -v {format_bytes(address_space_limit())}: after "
        f"{_FRAMEWORKS.get(framework, framework)} loaded this process may map {format_bytes(left)} more, "
        f"and {takes} take about {format_bytes(need)}; raise the limit by {format_bytes(need - left)} or more "
        f"({nothing})"
    )
