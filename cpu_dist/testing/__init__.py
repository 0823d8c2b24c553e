"""Support for tests and benchmarks of cpu_dist (not used by training)."""
