"""The serving side's error, apart from the bundle code: the launcher catches it on every
rank, and a parameter-server rank must not import torch (:mod:`cpu_dist.serving.bundle` does)
only to name it."""

from __future__ import annotations


class BundleError(RuntimeError):
    """A bundle that cannot be used; the message names the file and the problem."""
