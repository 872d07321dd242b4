"""Framework-neutral core, imports neither TensorFlow nor JAX. Layers, each importing only those
before it: ``core`` (config, errors, files, the loader registry) -> ``data`` (dataset, crops,
symmetries, DALI pipelines) and ``model`` (the U-Net contract, the LR schedule) -> ``runtime`` (the
run around a training loop) -> ``inference`` (predict, export, validate). ``console`` names the
console scripts' modules and imports them only when run."""
