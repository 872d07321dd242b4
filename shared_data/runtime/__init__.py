"""The run around a training loop, the same for TF and JAX: logs, records, ``Run``, the trainers' CLI, NVTX,
XLA flags."""
