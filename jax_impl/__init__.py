"""JAX (Flax, Optax) implementation: model, data, train, distribute. Imports no TensorFlow."""
