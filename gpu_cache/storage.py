"""Row storage of the cache: one torch tensor of ``capacity_units * 64`` rows by D, float32.

The same code runs on a GPU or on the CPU: only the host-to-device staging differs (pinned
buffers, a copy stream and an event when the device is CUDA, a plain copy otherwise).  On the
CPU the row copies and the cache SGD of the hot path use the native one-pass kernels of
``gpu_cache._metadata`` on ``host_rows`` (a numpy view of the same memory) instead of torch
ops and temporaries; ``native=False`` keeps the torch ops (the CUDA code) for tests.  All
row mutations go through here, so "which rows changed" is never spread across modules.
"""

from __future__ import annotations

import numpy as np
import torch

from cpu_dist.common.config import CACHE_ROWS_PER_UNIT as ROWS_PER_UNIT  # one definition
from gpu_cache._metadata import copy_rows


def sgd_step(
    rows: torch.Tensor,
    grads: np.ndarray | torch.Tensor,
    lr: float,
    divisor: int,
    owned: bool = False,
) -> torch.Tensor:
    """``rows - lr * (grads / divisor)`` in float32, the operation order of the PS optimizer
    (it divides the summed gradient by W, then applies ``w -= lr * g``), so cached copies stay
    bit-equal to PS rows.  ``owned``: ``grads`` is a fresh tensor that may be scaled in place."""
    g = torch.as_tensor(grads, dtype=torch.float32).to(rows.device)
    # A divisor on the device, not a Python scalar: CUDA turns division by a host scalar into
    # a multiplication by its reciprocal, which can differ from the PS's g / W in the last bit.
    div = torch.tensor(float(divisor), dtype=torch.float32, device=g.device)
    step = g.div_(div) if owned else g / div
    return rows.sub(step.mul_(lr))


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class RowStorage:
    """``rows[slot]`` is the value of the key the metadata put in ``slot``."""

    def __init__(
        self,
        capacity_units: int,
        dim: int,
        device: torch.device | str | None = None,
        native: bool = True,
    ) -> None:
        if capacity_units <= 0 or dim <= 0:
            raise ValueError(f"need capacity_units > 0 and dim > 0, got {capacity_units}, {dim}")
        self.device = torch.device(device) if device is not None else default_device()
        self.capacity_rows = capacity_units * ROWS_PER_UNIT
        self.dim = dim
        self.rows = torch.zeros((self.capacity_rows, dim), dtype=torch.float32, device=self.device)
        self._cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        # The same memory as `rows`, for the native kernels (None: use torch ops).
        self.host_rows = self.rows.numpy() if self.device.type == "cpu" and native else None

    @property
    def resident_bytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    # -- transfers ----------------------------------------------------------------------
    def to_device(self, host_rows: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Host float32 rows -> the cache device (pinned staging on its own stream on CUDA)."""
        t = torch.as_tensor(host_rows, dtype=torch.float32)
        if not self._cuda:
            return t
        staged = t.pin_memory()
        with torch.cuda.stream(self._stream):
            out = staged.to(self.device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(self._stream)
        torch.cuda.current_stream(self.device).wait_event(done)
        out.record_stream(torch.cuda.current_stream(self.device))
        assert self._stream is not None
        staged.record_stream(self._stream)  # the staging buffer lives until the copy ran
        return out

    @staticmethod
    def _index(slots: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
        return torch.as_tensor(np.asarray(slots, dtype=np.int64)).to(device)

    # -- reads and writes -----------------------------------------------------------------
    def gather(self, slots: np.ndarray) -> torch.Tensor:
        return self.rows.index_select(0, self._index(slots, self.device))

    def gather_into(self, slots: np.ndarray, out: np.ndarray, pos: np.ndarray) -> None:
        """``out[pos[i]] = rows[slots[i]]`` into host float32 rows."""
        if self.host_rows is not None:
            copy_rows(self.host_rows, slots, out, pos)
        elif len(slots):
            out[pos] = self.gather(slots).cpu().numpy()

    def scatter_from(self, slots: np.ndarray, host: np.ndarray, src: np.ndarray) -> None:
        """``rows[slots[i]] = host[src[i]]``; slots unique."""
        if self.host_rows is not None:
            copy_rows(host, src, self.host_rows, slots)
        elif len(slots):
            self.scatter(slots, self.to_device(host[src]))

    def scatter(self, slots: np.ndarray, values: torch.Tensor) -> None:
        """Write ``values[i]`` into ``slots[i]``; slots must be unique (metadata.admit's are)."""
        if len(slots):
            self.rows.index_copy_(0, self._index(slots, self.device), values.to(self.device))

    def sgd(
        self,
        slots: np.ndarray,
        grads: np.ndarray | torch.Tensor,
        lr: float,
        divisor: int,
        owned: bool = False,
    ) -> None:
        """``w -= lr * (g / divisor)`` for unique slots, in float32 like the PS optimizer.

        ``owned``: the caller hands over ``grads`` (a fresh copy), so it is scaled in place
        instead of through another temporary (same float32 operations, same results)."""
        if not len(slots):
            return
        idx = self._index(slots, self.device)
        new = sgd_step(
            self.rows.index_select(0, idx),
            self.to_device(grads),
            lr,
            divisor,
            owned=owned or self._cuda,
        )  # to_device made a fresh copy on CUDA
        self.rows.index_copy_(0, idx, new)
