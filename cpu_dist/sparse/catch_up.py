"""Rows pulled before some commits were applied, brought up to date on the worker.

Under ``--aggregation collective`` every worker holds each step's summed gradient of every row
the step writes (``Outgoing.summed``).  A pull that asks for ``row_steps`` learns, per row, the
last commit of the session that the row holds (the shard reads it under the row's lock, so a
commit applied during the pull is seen or not, never half).  Applying the later held steps to
the row with the shard's own arithmetic (``_ps.apply_rows``: divide by W, then the optimizer
of ``csrc/optimizer.h``) gives the row the shard will hold once those commits are applied,
bit for bit.  So ``--sparse-sync async`` reads never wait on the link for the last step's
commit, yet see every step before theirs (staleness 0).

A job of several tables keeps one of these per table (its lr, optimizer and eps).

Only without table rules: admission and expiry decide at the shard whether a commit touches a
row, which the worker cannot know in advance.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cpu_dist.common.schedule import CONSTANT, LrSchedule
from cpu_dist.common.sorted_keys import find_sorted
from cpu_dist.sparse import _ps


@dataclass(frozen=True)
class _Step:
    step: int
    written: np.ndarray  # sorted keys the step's commit writes
    sums: np.ndarray  # their summed gradients as the shard receives them, float32
    lr: float  # the step's rate (its commit carries it)


class RecentCommits:
    """The last ``depth`` steps' summed gradients, and the catch-up they allow."""

    def __init__(
        self,
        depth: int,
        lr: float,
        optimizer: str,
        world: int,
        compression: Literal["none", "fp16", "int8"] = "none",
        eps: float = 1e-8,
        schedule: LrSchedule = CONSTANT,
    ) -> None:
        """``eps``: Adagrad's (a table's spec; the other optimizers' is the shard's own);
        ``schedule``: each step is applied at its scheduled rate of ``lr``, as its commit."""
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.lr, self.optimizer, self.world, self.eps = lr, optimizer, world, eps
        self.schedule = schedule
        self.compression, self.depth = compression, depth
        self._steps: deque[_Step] = deque(maxlen=depth)

    @property
    def oldest(self) -> int | None:
        """The first step held (None: none yet)."""
        return self._steps[0].step if self._steps else None

    def add(self, step: int, written: np.ndarray, summed: np.ndarray) -> None:
        """Step ``step``'s rows and summed gradients (steps come in order)."""
        if self._steps and step != self._steps[-1].step + 1:
            self._steps.clear()  # a gap (a resumed job): nothing older may be used
        sums = summed
        if self.compression != "none":  # what the shard decodes from the compressed commit
            dim = summed.shape[1]
            sums = _ps.decode_rows(_ps.encode_rows(summed, self.compression), dim, self.compression)
        sums = np.ascontiguousarray(sums, dtype=np.float32)
        self._steps.append(_Step(step, written, sums, self.schedule.rate(self.lr, step)))

    def covers(self, held: np.ndarray, upto: int) -> np.ndarray:
        """Bool per row: every step in (held, upto] is held here (or none is needed)."""
        oldest = self.oldest
        if oldest is None or self._steps[-1].step < upto:
            return held >= upto
        return held >= oldest - 1

    def apply(
        self,
        keys: np.ndarray,
        rows: np.ndarray,
        held: np.ndarray,
        upto: int,
        states: np.ndarray | None = None,
    ) -> int:
        """In place: each row of ``keys`` (sorted unique), holding every commit up to job step
        ``held[i]``, brought to step ``upto`` (the caller checked :meth:`covers`).  Returns
        how many row updates were applied."""
        applied = 0
        for s in self._steps:
            if s.step > upto:
                break
            at, found = find_sorted(s.written, keys)
            pick = np.flatnonzero(found & (held < s.step))
            if len(pick) == 0:
                continue
            sub = np.ascontiguousarray(rows[pick])
            st = None if states is None else np.ascontiguousarray(states[pick])
            if self.optimizer == "adagrad":  # element-wise state [u, dim] and the table's eps
                _ps.apply_rows(
                    sub, s.sums[at[pick]], s.lr, self.optimizer, self.world, st, eps=self.eps
                )
            else:
                _ps.apply_rows(sub, s.sums[at[pick]], s.lr, self.optimizer, self.world, st)
            rows[pick] = sub
            if states is not None:
                states[pick] = st
            applied += len(pick)
        return applied
