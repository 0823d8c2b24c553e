"""What a TorchRec ``EmbeddingBagConfig`` gets of our fields (optimizer, lr, ...), which TorchRec's
config does not have: inside a job, the job's own (its table of that name, else the job's
defaults ``--sparse-optimizer`` and ``--sparse-lr``); outside one, ``EmbeddingBagConfig``'s
defaults.  The job builds its model under :func:`job_table_defaults`, which also collects one
note per converted table for the start line, so the choice is never silent."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from cpu_dist.embeddings.config import EmbeddingBagConfig

# Our fields that a same-named job table gives a TorchRec config.
JOB_FIELDS = ("optimizer", "lr", "eps", "seed", "admit_after", "expire_after")


@dataclass
class _JobDefaults:
    optimizer: str
    lr: float
    tables: dict[str, EmbeddingBagConfig]
    notes: dict[str, str] = field(default_factory=dict)


_CURRENT: contextvars.ContextVar[_JobDefaults | None] = contextvars.ContextVar(
    "cpu_dist_job_table_defaults", default=None
)


@contextlib.contextmanager
def job_table_defaults(
    optimizer: str, lr: float, tables: Sequence[EmbeddingBagConfig] = ()
) -> Iterator[list[str]]:
    """Within: a TorchRec config takes our fields from the job (see the module).  Yields the
    list that, on leaving, holds one note per table so converted (in conversion order)."""
    defaults = _JobDefaults(optimizer, lr, {t.name: t for t in tables})
    notes: list[str] = []
    token = _CURRENT.set(defaults)
    try:
        yield notes
    finally:
        _CURRENT.reset(token)
        notes.extend(defaults.notes.values())


def active() -> bool:
    """Whether a :func:`job_table_defaults` is in effect (an outer one wins over an inner)."""
    return _CURRENT.get() is not None


def our_fields(name: str) -> dict[str, object]:
    """The keyword arguments of our fields for a TorchRec config named ``name`` (empty
    outside a job: ``EmbeddingBagConfig``'s defaults), and the note that says so."""
    d = _CURRENT.get()
    if d is None:
        return {}
    job = d.tables.get(name)
    if job is not None:
        values = {f: getattr(job, f) for f in JOB_FIELDS}
        where = f"the job's table {name!r}"
    else:
        values = {"optimizer": d.optimizer, "lr": d.lr}
        where = "--sparse-optimizer and --sparse-lr"
    d.notes.setdefault(
        name,
        f"table {name!r} is a TorchRec EmbeddingBagConfig: optimizer {values['optimizer']}, "
        f"lr {values['lr']:g} from {where}",
    )
    return values
