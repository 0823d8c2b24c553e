"""Plugins for every test run from this checkout (unit, integration and MPI tests alike)."""

# CPU_DIST_REQUIRE: a skip of a required group (network lab, Slurm) fails the run.
pytest_plugins = ["tests.skip_policy"]
