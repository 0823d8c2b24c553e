"""One table's rows outside a job: a lazy store whose rows are created at first touch from
``contracts.row_init`` and updated by ``contracts.sparse_update`` (the parameter server's
optimizers in numpy), under the parameter server's admission and expiry rules
(``admit_after``, ``expire_after``; the text of ``cpu_dist/sparse/csrc/table_rules.h``).
:class:`~cpu_dist.embeddings.rows.LocalRows` keeps one per table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from cpu_dist.common.contracts import row_init, sparse_update, state_floats
from cpu_dist.common.sorted_keys import find_sorted

# What every table's arrays() holds, and what a table with rules adds: each held row's
# last-update step, the counts of ids seen but not admitted (the shard's checkpoint saves the
# same three things) and the step the table commits next.
ROW_ARRAYS = ("ids", "weight", "optimizer_state")
RULE_ARRAYS = ("last_update", "count_ids", "count", "last_seen", "step")


class TableSpec(Protocol):
    """What a row source reads of a table (an :class:`EmbeddingBagConfig`)."""

    @property
    def name(self) -> str: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def init_scale(self) -> float: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def lr(self) -> float: ...
    @property
    def eps(self) -> float: ...
    @property
    def admit_after(self) -> int: ...
    @property
    def expire_after(self) -> int: ...


class _Counts:
    """The admission counts of ids that hold no row (the shard's ``pending``): per id, how
    many steps it was seen in and the last of them, in arrays sorted by id."""

    def __init__(self) -> None:
        self.set(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))

    def set(self, ids: np.ndarray, count: np.ndarray, last_seen: np.ndarray) -> None:
        self.ids, self.count, self.last_seen = ids, count, last_seen

    def __len__(self) -> int:
        return len(self.ids)

    def seen(self, ids: np.ndarray) -> np.ndarray:
        """Each of ``ids``' count, 0 for an id without one."""
        pos, found = find_sorted(self.ids, ids)
        out = np.zeros(len(ids), dtype=np.int64)
        out[found] = self.count[pos[found]]
        return out

    def replace(self, ids: np.ndarray, count: np.ndarray, step: int) -> None:
        """Forget the counts of ``ids`` (sorted, unique), then count those of them whose
        ``count`` is above 0, last seen at ``step``."""
        pos, found = find_sorted(self.ids, ids)
        keep = np.ones(len(self.ids), dtype=bool)
        keep[pos[found]] = False
        new = count > 0
        merged = np.concatenate([self.ids[keep], ids[new]])
        order = np.argsort(merged, kind="stable")
        self.set(
            merged[order],
            np.concatenate([self.count[keep], count[new]])[order],
            np.concatenate([self.last_seen[keep], np.full(int(new.sum()), step, np.int64)])[order],
        )

    def expire(self, horizon: int) -> None:
        """Forget every count last seen at step ``horizon`` or earlier."""
        keep = self.last_seen > horizon
        self.set(self.ids[keep], self.count[keep], self.last_seen[keep])


class LazyTable:
    """One table's held rows, grown at first touch: float32 rows and optimizer state
    (``[.., dim]`` or ``[..]``, ``contracts.state_floats``) in touch order, in arrays whose
    capacity doubles, and a sorted index (ids, slots) to find them.  A new id moves only the
    index's int64 entries, never the rows, so a step that touches new ids costs
    ``O(index + new rows)``, not a copy of the table.

    The table holds what a shard of the parameter server would: rows that a step updated
    (:meth:`commit`), plus, for a table without rules, the rows the step in progress looked
    up while autograd recorded (that step will update them all; :meth:`discard_fresh` drops
    them if it is abandoned).  Any other id reads its first-touch row ``row_init``.

    With rules (``admit_after`` N > 1 or ``expire_after`` S > 0), :meth:`commit` of step t
    applies the shard's (``csrc/table_rules.h``): every id of the step's union without a row
    counts one more step (last seen t) and is admitted once its count reaches N; admitted ids
    (and ids with a row) get their gradient applied (a new row starts from ``row_init``,
    state 0) and last update t; the others hold no row.  Then every row last updated at
    t - S or earlier is dropped (it reads ``row_init`` again, state and count gone), and so is
    every count last seen at t - S or earlier.
    """

    def __init__(self, spec: TableSpec, seed: int) -> None:
        self.name, self.dim = spec.name, int(spec.embedding_dim)
        self.scale, self.seed = float(spec.init_scale), int(seed)
        self.optimizer, self.eps = spec.optimizer, float(spec.eps)
        self.admit_after = max(int(spec.admit_after), 1)  # 0 and 1: admission off
        self.expire_after = int(spec.expire_after)  # 0: expiry off
        self.rules = self.admit_after > 1 or self.expire_after > 0
        self.step = 0  # the step the next commit() is
        width = state_floats(self.optimizer, self.dim)
        self._state_shape: tuple[int, ...] = (self.dim,) if width > 1 else ()
        self._counts = _Counts()
        # What a shard's stats count (``rows_admitted``: rows a commit created under the
        # rules; ``rows_expired``: rows dropped), for a run to compare with its shards'.
        self.rows_admitted = self.rows_expired = 0
        self._fresh: list[np.ndarray] = []
        self._set(
            np.zeros(0, dtype=np.int64),
            np.zeros((0, self.dim), dtype=np.float32),
            np.zeros((0, *self._state_shape), dtype=np.float32),
            np.zeros(0, dtype=np.int64),
        )

    def _set(self, ids: np.ndarray, rows: np.ndarray, state: np.ndarray, last: np.ndarray) -> None:
        """Hold exactly these (sorted ids, their rows, state and last-update steps)."""
        self._ids = ids
        self._slots = np.arange(len(ids), dtype=np.int64)
        self._rows, self._state, self._last, self._n = rows, state, last, len(ids)

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> np.ndarray:
        """The held ids, sorted (a view: do not modify)."""
        return self._ids

    @property
    def rows(self) -> np.ndarray:
        """The held rows in id order (a copy)."""
        return self._rows[self._slots]

    @property
    def state(self) -> np.ndarray:
        """The held optimizer state in id order (a copy)."""
        return self._state[self._slots]

    @property
    def last_update(self) -> np.ndarray:
        """The step that last updated each held row of a table with rules, in id order (a
        copy; -1 in a table without rules, which keeps no steps)."""
        return self._last[self._slots]

    def _where(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return find_sorted(self._ids, ids)

    def _grow(self, extra: int) -> None:
        need = self._n + extra
        if need <= len(self._rows):
            return
        cap = max(need, 2 * len(self._rows), 16)
        rows = np.empty((cap, self.dim), dtype=np.float32)
        rows[: self._n] = self._rows[: self._n]
        state = np.zeros((cap, *self._state_shape), dtype=np.float32)
        state[: self._n] = self._state[: self._n]
        last = np.full(cap, -1, dtype=np.int64)
        last[: self._n] = self._last[: self._n]
        self._rows, self._state, self._last = rows, state, last

    def _insert(self, ids: np.ndarray, pos: np.ndarray, rows: np.ndarray) -> None:
        """Hold new ``ids`` (sorted, none held; ``pos`` their index positions) with these
        first-touch rows, state 0 and no last update."""
        m = len(ids)
        self._grow(m)
        slots = np.arange(self._n, self._n + m, dtype=np.int64)
        self._rows[slots] = rows
        self._state[slots] = 0.0
        self._last[slots] = -1
        self._ids = np.insert(self._ids, pos, ids)
        self._slots = np.insert(self._slots, pos, slots)
        self._n += m

    def _remove(self, ids: np.ndarray) -> None:
        """Hold no row for ``ids`` (sorted, held) any more; their slots are reclaimed when
        the dead ones outnumber the live ones."""
        pos, _ = self._where(ids)
        self._ids = np.delete(self._ids, pos)
        self._slots = np.delete(self._slots, pos)
        if self._n - len(self._ids) > max(len(self._ids), 16):
            self._set(self._ids.copy(), self.rows, self.state, self.last_update)

    def get(self, ids: np.ndarray, create: bool) -> np.ndarray:
        """Rows of sorted unique ``ids`` (a copy); ids without a row read their first-touch
        rows, which the table holds from now on when ``create`` (a recording lookup of a
        table without rules: the step in progress will update them)."""
        pos, found = self._where(ids)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        out[found] = self._rows[self._slots[pos[found]]]
        missing = ~found
        if missing.any():
            new = row_init(self.seed, ids[missing], self.dim, self.scale, self.name)
            out[missing] = new
            if create:
                self._insert(ids[missing], pos[missing], new)
                self._fresh.append(ids[missing])
        return out

    def discard_fresh(self) -> None:
        """Drop the rows :meth:`get` created since the last :meth:`commit` (their step was
        abandoned, so no step updated them: a shard would not hold them)."""
        if self._fresh:
            fresh = np.unique(np.concatenate(self._fresh))
            self._fresh.clear()
            self._remove(fresh[self._where(fresh)[1]])

    def update(self, ids: np.ndarray, grads: np.ndarray, lr: float) -> None:
        """``contracts.sparse_update`` on the held rows ``ids`` (sorted, unique) with their
        aggregated gradients, the parameter server's arithmetic.  No rules: the caller's
        step decides what to update (:meth:`commit` is a step)."""
        pos, found = self._where(ids)
        if not found.all():
            raise KeyError(f"table {self.name!r}: id {int(ids[~found][0])} was never looked up")
        slots = self._slots[pos]
        rows, state = self._rows[slots], self._state[slots]
        extra = {"eps": self.eps} if self.optimizer == "adagrad" else {}
        sparse_update(self.optimizer, rows, state, grads, lr, **extra)
        self._rows[slots], self._state[slots] = rows, state

    def commit(self, ids: np.ndarray, grads: np.ndarray, lr: float) -> int:
        """Step :attr:`step` of the table: ``ids`` (sorted, unique: every id the step looked
        up while autograd recorded, possibly none) with their summed gradients ``[u, dim]``
        (zeros for ids whose rows got none), under the table's rules; then the next step.
        Returns how many rows the gradients were applied to."""
        t, self.step = self.step, self.step + 1
        self._fresh.clear()
        pos, held = self._where(ids)
        admitted = np.ones(len(ids), dtype=bool)  # no rules: every id of the step
        if self.rules:
            admitted = held.copy()  # an id with a row is admitted
            waiting = np.flatnonzero(~held)
            count = self._counts.seen(ids[waiting]) + 1
            admit = count >= self.admit_after
            admitted[waiting[admit]] = True
            count[admit] = 0  # an admitted id's count is forgotten: it holds a row now
            self._counts.replace(ids[waiting], count, t)
        new = admitted & ~held
        self.rows_admitted += int(np.count_nonzero(new))
        if new.any():
            self._insert(
                ids[new], pos[new], row_init(self.seed, ids[new], self.dim, self.scale, self.name)
            )
        done = ids if admitted.all() else ids[admitted]
        if len(done):
            g = grads if len(done) == len(ids) else grads[admitted]
            self.update(done, np.ascontiguousarray(g, dtype=np.float32), lr)
            if self.rules:
                self._last[self._slots[self._where(done)[0]]] = t
        if self.expire_after > 0:
            horizon = t - self.expire_after
            dropped = self._ids[self.last_update <= horizon]
            self.rows_expired += len(dropped)
            self._remove(dropped)
            self._counts.expire(horizon)
        return len(done)

    @property
    def pending_counts(self) -> int:
        """Ids counted towards admission that hold no row yet (a shard's ``pending_counts``)."""
        return int(np.count_nonzero(self._counts.count > 0))

    def array_names(self) -> tuple[str, ...]:
        """The keys of :meth:`arrays` (and what :meth:`load` needs): the rows, and for a
        table with rules the rules' counters."""
        return ROW_ARRAYS + RULE_ARRAYS if self.rules else ROW_ARRAYS

    def arrays(self) -> dict[str, np.ndarray]:
        """The held state as arrays in id order (copies): ``ids``, ``weight``,
        ``optimizer_state``; with rules also ``last_update`` (int64, per held row),
        ``count_ids`` / ``count`` / ``last_seen`` (int64: the ids seen but not admitted) and
        ``step`` (int64 scalar: the next step), what continuing identically needs."""
        out = {"ids": self._ids.copy(), "weight": self.rows, "optimizer_state": self.state}
        if self.rules:
            out["last_update"] = self.last_update
            out["count_ids"] = self._counts.ids.copy()
            out["count"] = self._counts.count.copy()
            out["last_seen"] = self._counts.last_seen.copy()
            out["step"] = np.array(self.step, dtype=np.int64)
        return out

    def check(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Refuse :meth:`arrays`' that this table cannot hold: ids not sorted unique int64,
        rows not ``[n, dim]``, a state not of this optimizer's shape; with rules, counters
        missing or not of the shapes and ranges :meth:`arrays` gives; without rules, rule
        counters (a table with other rules saved them)."""
        where = f"table {self.name!r}"
        want = set(self.array_names())
        absent = [k for k in self.array_names() if k not in arrays]
        if absent:
            raise ValueError(
                f"{where}: no {', '.join(absent)} (admit_after {self.admit_after}, "
                f"expire_after {self.expire_after})"
            )
        foreign = [k for k in RULE_ARRAYS if k in arrays and k not in want]
        if foreign:
            raise ValueError(
                f"{where}: {', '.join(foreign)}: admission / expiry counters, but this table "
                "has no admit_after / expire_after rules"
            )
        ids = np.asarray(arrays["ids"])
        rows = np.asarray(arrays["weight"])
        state = np.asarray(arrays["optimizer_state"])
        if ids.dtype != np.int64 or ids.ndim != 1 or np.any(np.diff(ids) <= 0):
            raise ValueError(f"{where}: ids must be sorted unique int64 [n]")
        n = len(ids)
        if rows.shape != (n, self.dim):
            raise ValueError(f"{where}: weight {rows.shape}: expected ({n}, {self.dim})")
        if state.shape != (n, *self._state_shape):
            raise ValueError(
                f"{where}: optimizer_state {state.shape}: expected {(n, *self._state_shape)} "
                f"({self.optimizer})"
            )
        if self.rules:
            self._check_rules(arrays, ids)

    def _check_rules(self, arrays: Mapping[str, np.ndarray], ids: np.ndarray) -> None:
        where = f"table {self.name!r}"
        got = {k: np.asarray(arrays[k]) for k in RULE_ARRAYS}
        for k, a in got.items():
            if a.dtype != np.int64:
                raise ValueError(f"{where}: {k} must be int64, got {a.dtype}")
        step = got["step"]
        if step.shape != () or int(step) < 0:
            raise ValueError(f"{where}: step must be an int64 scalar >= 0, got {step}")
        t = int(step)
        last = got["last_update"]
        if last.shape != ids.shape or np.any((last < 0) | (last >= t)):
            raise ValueError(f"{where}: last_update must be [{len(ids)}] steps in [0, step {t})")
        counted = got["count_ids"]
        if counted.ndim != 1 or np.any(np.diff(counted) <= 0):
            raise ValueError(f"{where}: count_ids must be sorted unique int64 [m]")
        if len(counted) and find_sorted(ids, counted)[1].any():
            raise ValueError(f"{where}: count_ids: an id that holds a row has no count")
        m = len(counted)
        count, seen = got["count"], got["last_seen"]
        if count.shape != (m,) or np.any((count < 1) | (count >= self.admit_after)):
            raise ValueError(
                f"{where}: count must be [{m}] counts in [1, admit_after {self.admit_after})"
            )
        if seen.shape != (m,) or np.any((seen < 0) | (seen >= t)):
            raise ValueError(f"{where}: last_seen must be [{m}] steps in [0, step {t})")

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Replace the held state by :meth:`arrays`' (after :meth:`check`)."""
        self.check(arrays)
        n = len(arrays["ids"])
        last = np.full(n, -1, dtype=np.int64)
        if self.rules:
            last = np.array(arrays["last_update"], dtype=np.int64)
            self._counts.set(
                np.array(arrays["count_ids"], dtype=np.int64),
                np.array(arrays["count"], dtype=np.int64),
                np.array(arrays["last_seen"], dtype=np.int64),
            )
            self.step = int(np.asarray(arrays["step"]))
        self._fresh.clear()
        self._set(
            np.asarray(arrays["ids"], dtype=np.int64).copy(),
            np.array(arrays["weight"], dtype=np.float32),
            np.array(arrays["optimizer_state"], dtype=np.float32),
            last,
        )
