"""What the ``lowmem`` loader's fork server imports before it forks workers
(``multiprocessing``'s ``set_forkserver_preload``); nothing else imports this module.

A batch system's SIGTERM (``scancel``, a requeue, the time limit) reaches every process of the job,
the fork server included. The fork server must outlive it: its end kills the workers it forked (their
parent-death signal, :func:`shared_data.data.crop_workers.serve_parent`), and the trainer, which
handles the signal and stops at the next step boundary, would find its batch under way lost. So the
fork server ignores SIGTERM, as ``multiprocessing``'s own resource tracker does, and ends as it does
otherwise: when the trainer that started it ends (its pipe closes). Its workers inherit the ignored
SIGTERM until :func:`~shared_data.data.crop_workers.serve_parent` leaves it to the trainer alone.
"""

import signal

from shared_data.data import crop_workers  # noqa: F401  (imported once here, not in every worker)

signal.signal(signal.SIGTERM, signal.SIG_IGN)
