"""Runs a trainer module with the quality check's background warm-up turned off: the counterfactual of
``Monitor.warm`` for this study's A/B (``warm_ab.sh``), not a user's switch.

Usage: ``python experiments/ttq_two_minutes/without_warm.py -m jax_impl.train ARGS...`` (or
``tf_impl.train``): the same as ``python -m jax_impl.train ARGS...`` except that
``shared_data.inference.quality_check.Monitor.warm`` does nothing, so the first evaluation compiles the
forward on the training path, as the trainers did before the warm-up.
"""

import runpy
import sys

from shared_data.inference import quality_check


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        sys.exit(f"usage: {sys.argv[0]} -m MODULE [ARGS...] (got {sys.argv[1:]!r})")
    module = sys.argv[2]
    quality_check.Monitor.warm = lambda self, apply: None
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
