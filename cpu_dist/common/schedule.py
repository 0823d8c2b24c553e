"""Learning-rate warmup and decay: the one function every part of a job reads a step's rate
from (the dense optimizer, each table's commit, the catch-up and the cache's coherence, the
reference), so that they cannot disagree.

MLPerf's DLRM-DCNv2 reference schedule (TorchRec's ``dlrm_main``, ``--lr_warmup_steps``,
``--lr_decay_start``, ``--lr_decay_steps``), with steps counted from 1 as its scheduler counts
them (job step ``t`` is count ``n = t + 1``):

- ``n < warmup_steps``: linear warmup, ``base * n / warmup_steps``;
- ``decay_start <= n``: polynomial decay over ``decay_steps`` steps, ``base * ((decay_steps -
  k) / decay_steps) ** power`` with ``k = min(n - decay_start, decay_steps - 1)``, never below
  ``floor`` (MLPerf's power 2 and floor 1e-7), and held at its last value after the decay;
- otherwise ``base``.

One difference from the reference: between the end of the warmup and the start of the decay
the reference holds the last warmup rate (``(warmup - 1) / warmup`` of the base); here the
rate is the base, which is what the schedule describes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LrSchedule:
    """A rate per job step for any base rate (``--lr``, ``--sparse-lr``, a table's ``lr``).

    Example::

        schedule = LrSchedule(warmup_steps=100, decay_start=1000, decay_steps=500)
        rate = schedule.rate(0.1, step)
    """

    warmup_steps: int = 0
    decay_start: int = 0
    decay_steps: int = 0
    power: float = 2.0
    floor: float = 1e-7

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.decay_start < 0 or self.decay_steps < 0:
            raise ValueError(f"{self}: steps must be >= 0")
        if self.decay_steps and self.decay_start < self.warmup_steps:
            raise ValueError(
                f"the decay starts at step {self.decay_start}, before the warmup's "
                f"{self.warmup_steps} steps end"
            )
        if not self.power > 0 or not self.floor >= 0:
            raise ValueError(f"{self}: power must be > 0 and floor >= 0")

    @property
    def constant(self) -> bool:
        """No warmup and no decay: every step's rate is the base."""
        return self.warmup_steps == 0 and self.decay_steps == 0

    def rate(self, base: float, step: int) -> float:
        """The rate of job step ``step`` (0-based) for ``base``."""
        n = step + 1
        if n < self.warmup_steps:
            return base * n / self.warmup_steps
        if self.decay_steps and n >= self.decay_start:
            k = min(n - self.decay_start, self.decay_steps - 1)
            scale = ((self.decay_steps - k) / self.decay_steps) ** self.power
            return max(self.floor, base * scale)
        return base


CONSTANT = LrSchedule()
