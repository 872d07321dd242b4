"""TensorFlow (Keras 3) implementation: model, data, train, distribute. Imports no JAX."""
