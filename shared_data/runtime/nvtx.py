"""NVTX ranges for Nsight Systems, and the capture window, shared by both frameworks.

``nvtx_range("step")`` marks a region on the timeline when the ``nvtx`` Python package is installed
(``pip install nvtx``; DALI's staging brings it to the GPU machine) and does nothing otherwise.
Inside :func:`mirrored_in` the same range also opens the framework's own annotation
(``jax.profiler.TraceAnnotation``, ``tf.profiler.experimental.Trace``), so TensorBoard's profile view
shows the ranges Nsight Systems shows.
:class:`CaptureWindow` calls ``cudaProfilerStart`` / ``cudaProfilerStop`` around configured steps so
``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop`` records exactly that window.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable, Iterator, Sequence

log = logging.getLogger(__name__)

#: The framework's trace annotation that every NVTX range also opens (None: NVTX alone).
_mirror: contextvars.ContextVar[Callable[[str], contextlib.AbstractContextManager] | None] = contextvars.ContextVar(
    "nvtx_mirror", default=None
)


@functools.cache
def _nvtx_module():
    try:
        import nvtx  # type: ignore
    except ImportError:
        log.info("nvtx package not installed: NVTX ranges are off")
        return None
    return nvtx


@contextlib.contextmanager
def mirrored_in(annotate: Callable[[str], contextlib.AbstractContextManager] | None) -> Iterator[None]:
    """Inside the ``with``, every :func:`nvtx_range` also opens ``annotate(name)`` (the framework's
    profiler annotation); ``None`` leaves NVTX alone."""
    token = _mirror.set(annotate)
    try:
        yield
    finally:
        _mirror.reset(token)


@contextlib.contextmanager
def nvtx_range(name: str, color: str = "blue") -> Iterator[None]:
    """Push an NVTX range named ``name`` for the body of the ``with`` (a no-op without ``nvtx``), and
    the framework's annotation of the same name inside :func:`mirrored_in`."""
    mod, mirror = _nvtx_module(), _mirror.get()
    with contextlib.ExitStack() as stack:
        if mirror is not None:
            stack.enter_context(mirror(name))
        if mod is not None:
            stack.enter_context(mod.annotate(name, color=color))
        yield


@functools.cache
def _cudart() -> ctypes.CDLL | None:
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    found = ctypes.util.find_library("cudart")
    if found:
        names.insert(0, found)
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def cuda_profiler_call(which: str) -> bool:
    """Call ``cudaProfilerStart`` or ``cudaProfilerStop``; False (and a log line) if no CUDA runtime."""
    lib = _cudart()
    if lib is None:
        log.warning("CUDA runtime not found: %s skipped", which)
        return False
    return getattr(lib, which)() == 0


class CaptureWindow:
    """Start profiling before step ``start`` and stop after step ``stop - 1`` (``[start, stop)``).

    Call :meth:`before_step` with each global step index before running it, and :meth:`close` at the
    end (or use the window as a context manager). ``on_start`` / ``on_stop`` default to the CUDA
    profiler API; frameworks pass their own trace hooks too (``jax.profiler.start_trace``,
    ``tf.profiler.experimental.start``). ``steps`` None: no window (:func:`capture_window`). Used as a
    context manager, it also mirrors every NVTX range into ``annotate`` (the framework's trace
    annotation) while it is open.
    """

    def __init__(
        self,
        steps: Sequence[int] | None,
        on_start: Sequence[Callable[[], object]] = (),
        on_stop: Sequence[Callable[[], object]] = (),
        use_cuda: bool = True,
        annotate: Callable[[str], contextlib.AbstractContextManager] | None = None,
    ):
        self.start, self.stop = (steps[0], steps[1]) if steps else (None, None)
        self._on_start = list(on_start) + (
            [functools.partial(cuda_profiler_call, "cudaProfilerStart")] if use_cuda else []
        )
        self._on_stop = list(on_stop) + (
            [functools.partial(cuda_profiler_call, "cudaProfilerStop")] if use_cuda else []
        )
        self.active = False
        self._annotate, self._mirrored = annotate, None

    def before_step(self, step: int) -> None:
        """Open the window at ``start``, close it at ``stop``."""
        if self.start is None:
            return
        if step == self.start and not self.active:
            log.info("profiling window opens at step %d", step)
            for fn in self._on_start:
                fn()
            self.active = True
        elif step == self.stop and self.active:
            self.close()

    def close(self) -> None:
        """Close the window if it is open."""
        if self.active:
            for fn in self._on_stop:
                fn()
            self.active = False
            log.info("profiling window closed")

    def __enter__(self) -> CaptureWindow:
        """Inside the ``with``, every :func:`nvtx_range` also opens ``annotate(name)`` (:func:`mirrored_in`)."""
        self._mirrored = mirrored_in(self._annotate)
        self._mirrored.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        finally:
            self._mirrored.__exit__(*exc)


def capture_window(
    cfg,
    steps_per_epoch: int,
    start_trace: Callable[[], object],
    stop_trace: Callable[[], object],
    use_cuda: bool,
    annotate: Callable[[str], contextlib.AbstractContextManager] | None = None,
) -> CaptureWindow:
    """The run's :class:`CaptureWindow` over the global steps of ``cfg.profile_steps``, else with
    ``enable_manual_profiling`` the tutorial's first 60 steps of epoch 2 (no window otherwise): the
    framework's trace (``start_trace`` / ``stop_trace``), with ``use_cuda`` the CUDA profiler API, and
    NVTX ranges mirrored into ``annotate`` while the window is entered."""
    steps = cfg.profile_steps
    if steps is None and cfg.enable_manual_profiling:
        steps = (steps_per_epoch, steps_per_epoch + 60)
    return CaptureWindow(steps, [start_trace], [stop_trace], use_cuda=use_cuda, annotate=annotate)


def step_range(enabled: bool, step: int) -> contextlib.AbstractContextManager:
    """The tutorial's per-step NVTX range (``enable_manual_profiling``), named ``step <global step>``;
    nothing when not ``enabled``."""
    return nvtx_range(f"step {step}", "purple") if enabled else contextlib.nullcontext()
