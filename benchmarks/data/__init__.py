"""Deterministic synthetic data sets for feedline's benchmarks and tests."""
