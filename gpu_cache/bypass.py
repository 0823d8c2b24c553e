"""The low-hit bypass: stop filling a cache that does not hit.

A cached read costs a metadata query and copies of its hits, and then an admission: copies of
its misses into the cache and the evictions they cause.  When recent reads hit almost nothing
(a trace with no reuse within the cache's reach), the admission is wasted work, so the reader
skips it: hits are still served (and their eviction scores refreshed), misses are read from
the PS or the staged rows as always, and coherence keeps running.  While bypassing, every
``probe_every``-th read admits again and measures: the bypass ends when a probe's hit rate is
back at the threshold.
"""

from __future__ import annotations

from collections import deque


class LowHitBypass:
    def __init__(self, threshold: float, window: int = 8, probe_every: int = 16) -> None:
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"bypass threshold {threshold}: expected 0 <= threshold < 1")
        if window < 1 or probe_every < 1:
            raise ValueError("window and probe_every must be >= 1")
        self.threshold, self.window, self.probe_every = threshold, window, probe_every
        self._recent: deque[tuple[int, int]] = deque(maxlen=window)  # (hits, lookups)
        self.bypassing = False
        self._since_probe = 0

    def use_cache(self) -> bool:
        """Whether the next read admits its misses (a normal read or a probe)."""
        if not self.bypassing:
            return True
        self._since_probe += 1
        if self._since_probe >= self.probe_every:
            self._since_probe = 0
            return True
        return False

    def record(self, hits: int, lookups: int) -> None:
        """The outcome of a read that admits (its hits and lookups)."""
        if self.threshold == 0.0 or lookups == 0:
            return
        self._recent.append((hits, lookups))
        rate = sum(h for h, _ in self._recent) / max(sum(n for _, n in self._recent), 1)
        if self.bypassing:
            if hits >= self.threshold * lookups:  # a probe that hits: the window starts anew
                self.bypassing = False
                self._recent.clear()
                self._recent.append((hits, lookups))
        elif len(self._recent) == self.window and rate < self.threshold:
            self.bypassing = True
            self._since_probe = 0
