"""Worker processes of the ``lowmem`` loader: each reads crops through its own h5py handle and writes
each batch into a shared-memory slot that the parent copies out.

h5py holds one process-wide lock for the whole of a read, and the HDF5 library serializes its
calls, so threads of one process read crops one at a time whatever their number. Processes, each
with its own handle (the tutorial's PyTorch ``DataLoader`` workers), read in parallel.

* Start: the workers are forked from a fork server (a fresh interpreter that has imported this
  module, not the parent, whose TensorFlow/JAX threads a fork would copy mid-state), once per
  :class:`CropWorkers`, when the first batch is asked for; they serve every later epoch.
* Transfer: a batch (600 MB for 64 crops of 64^3 x 9 channels) never goes through a pipe. The parent
  sends a slot name and the draws (a few hundred bytes); the worker writes inputs and targets into
  the slot (:func:`shared_data.data.crop_readers.make_batch` with ``out``); the parent copies them out
  and puts the slot back on the free list, so slots are reused and the caller owns its arrays.
* End: :meth:`CropWorkers.close`, the object's collection, or the interpreter's exit stop the workers
  (a worker still running after :data:`JOIN_S` is killed) and unlink every slot.
* Signals: SIGINT and SIGTERM to the process group (Ctrl-C, ``scancel``) are the parent's to
  handle; the workers and their fork server (:mod:`shared_data.data.fork_server`) start with both
  blocked (:func:`workers_started`), ignore them, and end when the parent closes them. A parent that dies without
  closing them (kill -9, the OOM killer) takes them along: the kernel's parent-death signal
  (``prctl(PR_SET_PDEATHSIG)``, Linux) kills a worker when the fork server that forked it ends,
  which it does when the parent ends, and a thread in each worker that watches the parent's
  process id (:data:`PARENT_WATCH_S`) covers other systems.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.data.crop_readers import make_batch
from shared_data.data.sampler import Draws

#: Seconds a batch may take before the loader gives up on its worker (a read that hangs, e.g. on a
#: stalled network file system); a batch of 64 crops of 64^3 takes seconds.
BATCH_TIMEOUT_S = 300.0
#: Seconds :meth:`CropWorkers.close` waits for a worker to finish its batch before terminating it.
JOIN_S = 5.0
SHM_DIR = "/dev/shm"
#: Seconds between a worker's checks that the process that started it is still alive.
PARENT_WATCH_S = 1.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def batch_shapes(n: int, cfg: Config) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of the inputs (n, s, s, s, N_in) and targets (n, s, s, s, N_out) of a batch of ``n`` crops."""
    s = cfg.crop_size
    return (n, s, s, s, cfg.N_in_channels), (n, s, s, s, cfg.N_out_channels)


def _views(buf, n: int, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """float32 inputs and targets of a batch of ``n`` crops laid one after the other at the start of ``buf``."""
    shape_x, shape_y = batch_shapes(n, cfg)
    x = np.ndarray(shape_x, np.float32, buffer=buf)
    y = np.ndarray(shape_y, np.float32, buffer=buf, offset=x.nbytes)
    return x, y


# --- in the worker ---------------------------------------------------------------------------------

_WORKER: dict = {}


def serve_parent(parent: int) -> None:
    """Make this process a loader worker of process ``parent``. SIGINT and SIGTERM from others than
    ``parent`` (Ctrl-C and ``scancel`` signal the whole process group) are ignored: the parent
    handles them and stops its workers; a SIGTERM from ``parent`` itself (a process pool stopping
    its workers) ends the worker. The worker also ends when ``parent`` ends: by the parent-death
    signal where the kernel has one (it fires when this process's own parent ends: ``parent`` or
    the fork server that ``parent`` started, which ends with it) and by a thread that watches
    ``parent``'s process id. Called outside the main thread (where Python sets no signal
    handling) or on a system without ``sigwaitinfo``, SIGTERM keeps its default action."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if hasattr(signal, "sigwaitinfo"):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit it
            threading.Thread(target=_sigterm_from, args=(parent,), name="sigterm", daemon=True).start()
    except ValueError:  # not the main thread
        pass
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while True:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # alive, another user's (a reused id is not ours to judge)
                pass
            time.sleep(PARENT_WATCH_S)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def start_resource_tracker() -> None:
    """Start :mod:`multiprocessing`'s resource tracker of this process (once) with SIGUSR1 blocked,
    which it keeps blocked for good (it unblocks only SIGINT and SIGTERM, which it ignores): SLURM's
    SIGUSR1 to every process of the step would end it, and its successor prints a KeyError traceback
    for each shared-memory segment it never registered. The tracker unlinks what a process killed
    without closing its loader leaves (kill -9, the OOM killer) without its warning of "leaked"
    semaphores and shared memory (:data:`QUIET_TRACKER`): the run's own lines say how it ended."""
    with _tracker_quiet():
        if not hasattr(signal, "pthread_sigmask"):
            resource_tracker.ensure_running()
            return
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            resource_tracker.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


#: The warnings filter the resource tracker starts with (a ``-W`` option: :mod:`multiprocessing` passes
#: ``sys.warnoptions`` on to the interpreter it starts).
QUIET_TRACKER = "ignore:resource_tracker:UserWarning"


@contextlib.contextmanager
def _tracker_quiet() -> Iterator[None]:
    """While the resource tracker starts, :data:`QUIET_TRACKER` among ``sys.warnoptions``."""
    added = QUIET_TRACKER not in sys.warnoptions
    if added:
        sys.warnoptions.append(QUIET_TRACKER)
    try:
        yield
    finally:
        if added:
            sys.warnoptions.remove(QUIET_TRACKER)


@contextlib.contextmanager
def workers_started() -> Iterator[None]:
    """Around the start of worker processes (this module's fork server and its workers, DALI's
    ``spawn`` workers): SIGTERM and SIGINT are blocked in the starting thread, so each started
    process begins with them blocked in every thread it will have (a signal mask survives fork and
    exec) until it ignores them or takes them in one waiting thread (:func:`serve_parent`). Blocked
    only from :func:`serve_parent` on, they stay open while the process imports and in the threads
    that its imports start (numpy's BLAS pool): a SIGTERM to the process group lands there, its
    default action ends the worker, and DALI's next task for that worker waits forever on its
    queue; a Ctrl-C there is a traceback in the run's console. In this
    process a signal that arrives meanwhile goes to another thread or waits the few milliseconds of
    the start. :mod:`multiprocessing`'s resource tracker is started first
    (:func:`start_resource_tracker`): its start unblocks SIGINT and SIGTERM in the calling thread.
    SIGUSR1 (SLURM's warning before the time limit, sent to every process of the step) stays blocked
    for good in every process started here: the trainer alone takes it and stops at a step boundary;
    its default action would end the workers (the batch under way lost, the epoch abandoned). Does
    nothing where the system has no ``pthread_sigmask``."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    start_resource_tracker()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _sigterm_from(parent: int) -> None:
    """Wait for SIGTERM (blocked in every thread); end the process when ``parent`` sent it."""
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(128 + signal.SIGTERM)


def _init(reader, cfg: Config, parent: int) -> None:
    serve_parent(parent)
    _WORKER.update(reader=reader, cfg=cfg, slots={})


def _fill(slot: str, draws: Draws) -> None:
    """Write the batch of ``draws`` into shared-memory segment ``slot`` (attached once per worker)."""
    reader, cfg, slots = _WORKER["reader"], _WORKER["cfg"], _WORKER["slots"]
    if slot not in slots:
        slots[slot] = SharedMemory(name=slot)
    make_batch(reader, draws, cfg, out=_views(slots[slot].buf, len(draws), cfg))


# --- in the parent ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """While a worker starts, show :mod:`multiprocessing` an empty ``__main__``: a started process
    otherwise imports the parent's main module (``python -m jax_impl.train`` would import JAX or
    TensorFlow into every worker, seconds each), and a script without an ``if __name__ ==
    "__main__"`` guard would run again there. The workers need only this module. The swap lasts the
    few milliseconds of a start, at the first batches of a :class:`CropWorkers`."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _Pool:
    """The executor and the slots of one :class:`CropWorkers` (what its finalizer releases)."""

    def __init__(self):
        self.executor: cf.ProcessPoolExecutor | None = None
        self.slots: list[SharedMemory] = []
        self.free: list[SharedMemory] = []
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            executor, self.executor = self.executor, None
            slots, self.slots, self.free = self.slots, [], []
        if executor is not None:
            procs = list((getattr(executor, "_processes", None) or {}).values())
            manager = getattr(executor, "_executor_manager_thread", None)
            executor.shutdown(wait=False, cancel_futures=True)
            deadline = time.monotonic() + JOIN_S  # one bound for all the workers
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(JOIN_S)
            # The executor's manager thread drops the last references to its queues as it ends, and
            # their named semaphores' finalizers unlink each and then tell the resource tracker; a
            # process that exits between the two leaves the tracker a "leaked semaphore" warning on
            # stderr. With the workers gone the thread ends at once: wait for it here.
            if manager is not None:
                manager.join(JOIN_S)
        for shm in slots:
            try:
                shm.close()
            except BufferError:  # a view still exported by a thread that timed out; the unlink frees it
                pass
            try:
                shm.unlink()
            except FileNotFoundError:
                pass


class CropWorkers:
    """``num_workers`` processes that read batches of ``reader``'s crops into shared memory.

    Args:
        reader: a picklable crop reader (:class:`shared_data.data.crop_readers.H5LowMemReader`); each
            worker gets a copy, which opens the file itself.
        cfg: crop size, channel counts and vector channels (:func:`make_batch`).
        num_workers: processes (``cfg.num_data_workers``).

    Thread-safe: :meth:`batch` may be called from several threads at once (a slot each).
    """

    def __init__(self, reader, cfg: Config, num_workers: int):
        self.reader, self.cfg, self.num_workers = reader, cfg, num_workers
        self._pool = _Pool()
        self._finalizer = weakref.finalize(self, self._pool.close)

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers (empty before the first batch and after :meth:`close`)."""
        executor = self._pool.executor
        return sorted((getattr(executor, "_processes", None) or {}).keys()) if executor else []

    @property
    def slot_names(self) -> list[str]:
        """Names of the shared-memory segments (files under /dev/shm) this object holds now."""
        return [shm.name for shm in self._pool.slots]

    def _executor(self) -> cf.ProcessPoolExecutor:
        pool = self._pool
        with pool.lock:
            if pool.closed:
                raise RuntimeError(f"the lowmem workers reading {self.reader.path} are closed")
            if pool.executor is None:
                start_resource_tracker()  # before the pool's queues' semaphores would start it
                ctx = mp.get_context("forkserver")
                ctx.set_forkserver_preload(["shared_data.data.fork_server"])  # this module, SIGTERM ignored
                pool.executor = cf.ProcessPoolExecutor(
                    self.num_workers,
                    mp_context=ctx,
                    initializer=_init,
                    initargs=(self.reader, self.cfg, os.getpid()),
                )
            return pool.executor

    def _slot(self, nbytes: int) -> SharedMemory:
        pool = self._pool
        with pool.lock:
            for i, shm in enumerate(pool.free):
                if shm.size >= nbytes:
                    return pool.free.pop(i)
            if os.path.isdir(SHM_DIR):
                st = os.statvfs(SHM_DIR)
                if st.f_bavail * st.f_frsize < nbytes:
                    raise UserError(
                        f"{SHM_DIR} has {st.f_bavail * st.f_frsize / 2**20:.0f} MiB free; a lowmem batch needs "
                        f"{nbytes / 2**20:.0f} MiB there per data worker (give the container more shared memory, "
                        "e.g. docker --shm-size, or use --data_loader_config inmem)"
                    )
            start_resource_tracker()  # before the segment's registration would start it
            shm = SharedMemory(create=True, size=nbytes)
            pool.slots.append(shm)
            return shm

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """Around a submit that may start a worker (and, the first time, the fork server): one start at
        a time, ``__main__`` hidden, and the run's signals blocked (:func:`workers_started`): the fork
        server ignores SIGINT only once its imports are done, and a Ctrl-C while numpy imports there
        printed its traceback into the run's console."""
        with self._pool.lock, _main_hidden(), workers_started():
            yield

    def batch(self, draws: Draws) -> tuple[np.ndarray, np.ndarray]:
        """The batch of ``draws``, read by a worker: ``(inputs, targets)`` float32 (n, s, s, s, N_in)
        and (n, s, s, s, N_out), new arrays owned by the caller, equal bit for bit to
        ``make_batch(reader, draws, cfg)``.

        Raises:
            DatasetError: the worker's read failed (the file removed, truncated or damaged; its message
                names the file).
            RuntimeError: a worker died (killed, or crashed in the HDF5 library), the batch took more
                than :data:`BATCH_TIMEOUT_S` (the workers are then closed), or the workers are closed.
        """
        executor = self._executor()
        start = len(getattr(executor, "_processes", None) or {}) < self.num_workers  # a submit may start one
        shape_x, shape_y = batch_shapes(len(draws), self.cfg)
        slot = self._slot(4 * (int(np.prod(shape_x)) + int(np.prod(shape_y))))
        reusable, future = False, None
        try:
            try:
                with self._starting() if start else contextlib.nullcontext():
                    future = executor.submit(_fill, slot.name, draws)
                future.result(timeout=BATCH_TIMEOUT_S)
            except cf.TimeoutError:
                self.close()  # a hung worker would otherwise hold the interpreter's exit
                raise RuntimeError(
                    f"a lowmem worker reading {self.reader.path} took more than {BATCH_TIMEOUT_S:.0f} s for one batch"
                ) from None
            except BrokenProcessPool:
                raise RuntimeError(
                    f"a lowmem worker reading {self.reader.path} ended unexpectedly (killed, out of memory, or "
                    "crashed in the HDF5 library)"
                ) from None
            except BaseException:
                reusable = future is not None and future.done()  # a worker raised: it writes no more
                raise
            reusable = True
            x, y = _views(slot.buf, len(draws), self.cfg)
            out = np.array(x, copy=True), np.array(y, copy=True)
            del x, y
            return out
        finally:
            if reusable:
                with self._pool.lock:
                    if not self._pool.closed:
                        self._pool.free.append(slot)

    def close(self) -> None:
        """Stop the workers (a batch under way for at most :data:`JOIN_S`) and unlink the slots; idempotent."""
        self._finalizer()
