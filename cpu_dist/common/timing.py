"""A stopwatch per named phase, shared by the worker loop and the cache stage (which must not
import the training package, and must not load scikit-learn for a stopwatch)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator


class PhaseTimer:
    """Accumulates wall seconds per phase name: ``with timer("pull"): ...``.  Nested phases
    both count their time."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._totals[name] += time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        """Account time measured elsewhere (e.g. on another thread)."""
        self._totals[name] += seconds

    def totals(self) -> dict[str, float]:
        """Seconds per phase since creation, in first-use order."""
        return dict(self._totals)
