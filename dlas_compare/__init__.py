"""Side-by-side comparison and benchmarks of the TF, JAX and PyTorch-reference implementations (imports both)."""
