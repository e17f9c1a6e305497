"""Benchmarks of the package (speed, memory, precision, prefetching, loading): ``python -m benchmarks.bench``;
their results are the JSON files in ``benchmarks/results/``."""
