"""Where a trainer's start goes: runs ``{jax,tf}_impl.train``'s ``main`` with a timer around each named part
of its start (the trainer's own functions, wrapped in this process only) and writes, for each call, its
start and end in seconds from this process's start. The gaps between the parts are the trainer's other
work (the command line, the config, the checks).

    PYTHONPATH=. python experiments/trainer_start/phases.py jax OUT.json -- --config quality ... --num_epochs 1
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
import time

T0 = time.perf_counter()

from shared_data.core.files import write_atomic  # noqa: E402

# (owner attribute of the trainer module or "" for the module itself, function name, label)
PARTS = [
    ("", "open_run", "open_run: the run folder, the devices, the data check"),
    ("", "initial_state", "initial_state: the model, the optimizer, the train state"),
    ("", "Checkpoints", "Checkpoints: the checkpoint manager"),
    ("resume_mod", "resume", "resume: the newest checkpoint, if any"),
    ("data_mod", "make_input", "make_input: an input pipeline (train, then val)"),
    ("", "compile_steps", "compile_steps: the train and eval steps compiled"),
    ("", "evaluate", "evaluate: the validation loss (step 0, then each epoch)"),
    ("", "quality_monitor", "quality_monitor: the validation volume read, the forward built"),
    ("", "train_epoch", "train_epoch: an epoch's steps"),
]


def timed(calls: list, fn, label: str):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter() - T0
        try:
            return fn(*args, **kwargs)
        finally:
            calls.append({"part": label, "start": start, "end": time.perf_counter() - T0})

    return wrapper


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[1] not in ("jax", "tf") or sys.argv[3] != "--":
        sys.exit(f"usage: {sys.argv[0]} jax|tf OUT.json -- TRAINER_ARGS... (got {sys.argv[1:]!r})")
    framework, out, argv = sys.argv[1], sys.argv[2], sys.argv[4:]
    calls = [{"part": "import the trainer module", "start": time.perf_counter() - T0}]
    train = importlib.import_module(f"{framework}_impl.train")
    calls[0]["end"] = time.perf_counter() - T0
    for owner, name, label in PARTS:
        holder = getattr(train, owner) if owner else train
        setattr(holder, name, timed(calls, getattr(holder, name), label))
    rc = train.main(argv)
    calls.append({"part": "the trainer's main returned", "start": time.perf_counter() - T0})
    calls[-1]["end"] = calls[-1]["start"]
    calls.sort(key=lambda c: c["start"])
    write_atomic(out, json.dumps({"framework": framework, "argv": argv, "rc": rc, "calls": calls}, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
