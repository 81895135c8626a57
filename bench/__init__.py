"""Benchmarks (``make bench``); never part of the test run's pass/fail."""
