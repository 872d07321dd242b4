"""Framework-neutral core: config, dataset and generator, crops and symmetries, LR schedule, NVTX, DALI pipelines."""
