"""The data: dataset contract and physics generator, cube symmetries, crop sampling and readers, DALI pipelines."""
