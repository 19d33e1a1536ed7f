"""Deterministic synthetic data sets (``feedline make-data``): photo-like images and Criteo-like rows, also used
by the benchmarks and the tests. Part of the product, beside the library: it imports nothing of it."""
