"""Type stubs for the native module gpu_cache._metadata (see csrc/)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_I64 = npt.NDArray[np.int64]

def copy_rows(
    src: npt.NDArray[np.float32],
    src_idx: npt.ArrayLike,
    dst: npt.NDArray[np.float32],
    dst_idx: npt.ArrayLike,
) -> None: ...

class BagPipeCacheMetadata:
    def __init__(self, capacity_rows: int) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def size(self) -> int: ...
    def query(
        self, keys: npt.ArrayLike, scores: npt.ArrayLike | None = None
    ) -> tuple[_I64, _I64]: ...
    def lookup(self, keys: npt.ArrayLike) -> _I64: ...
    def admit(
        self,
        keys: npt.ArrayLike,
        scores: npt.ArrayLike | None = None,
        max_admit: int = -1,
        score_gate: bool = False,
    ) -> tuple[_I64, _I64, _I64]: ...
    def invalidate(self, keys: npt.ArrayLike) -> int: ...
    def clear(self) -> None: ...
    def resident(self) -> tuple[_I64, _I64]: ...
    def sgd_resident(
        self,
        keys: npt.ArrayLike,
        grads: npt.ArrayLike,
        lr: float,
        divisor: float,
        rows: npt.NDArray[np.float32],
    ) -> int: ...
    def record_updates(self, keys: npt.ArrayLike, step: int) -> None: ...
    def previous_update(self, keys: npt.ArrayLike) -> _I64: ...
    def prune_updates(self, committed: int) -> int:
        """Forget keys whose last update is a step <= committed (a read waits for no commit:
        previous_update says -1); returns how many."""
    @property
    def update_entries(self) -> int: ...
