"""What a job says it runs with, under its start line (worker 0 prints them): settings that
are easy to get wrong silently, said aloud.  Each note is one line without the ``cpu_dist:``
prefix; the functions are pure, so tests call them without a job."""

from __future__ import annotations

from collections.abc import Sequence

from cpu_dist.common.config import Config
from cpu_dist.common.dense_optimizer import describe


def dense_note(cfg: Config) -> str:
    """The dense optimizer and every setting it runs with (torch's defaults included, so that
    ``adamw``'s weight decay 0.01 is never a surprise)."""
    t = cfg.train
    return f"dense optimizer {describe(t.dense_optimizer, t.lr, t.dense_optimizer_args)}"


def start_notes(
    cfg: Config, table_notes: Sequence[str] = (), thread_notes: Sequence[str] = ()
) -> list[str]:
    """The notes of a job, in the order printed: the dense optimizer, each TorchRec
    ``EmbeddingBagConfig`` the model converted (``train.job_model.build_job_model``), then
    each rank's threads (``train.thread_check.thread_notes``)."""
    return [dense_note(cfg), *table_notes, *thread_notes]
