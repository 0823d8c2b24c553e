"""Run metrics: the JSON-lines log and TensorBoard, the logged step's figures (samples/s,
train AUC and NE, learning rates).  The end's summary tables are ``train.summary``'s, the
console's progress ``train.progress``'s.

JSON-lines layout (one object per line, flushed as written, so a crashed run keeps its log
and ``scripts/plot_metrics.py`` can plot a run that is still going), read back with
``cpu_dist.common.metrics_log.read_records``:

- the header, first: ``{"cpu_dist_log": 1, "run": ID}``, the run id its checkpoints record
  (``cpu_dist.common.metrics_log``; logs of older versions have none);
- step lines: ``step``, ``loss``, ``samples_per_s``, ``t_<phase>`` (seconds spent in that
  phase since the start of the run, cumulative, as ``cpu_dist.common.timing.PhaseTimer``
  gives them),
  ``bytes_pulled``/``bytes_pushed`` (cumulative) and any further numbers;
- eval lines: ``step``, ``eval_auc``, ``eval_logloss``;
- a test line at the end where the data has a test split (``--test-batches``): ``step``,
  ``test_auc``, ``test_logloss``;
- a final ``{"summary": {...}}`` line; its ``tables`` object holds each embedding table's
  figures summed over the shards (``train.summary.TABLE_FIGURES``, ``per_table_figures``) beside the
  ``ps_*`` totals.

A log is replaced only at its run's first record (:class:`JsonLinesWriter`), so a job that
fails at start leaves an earlier log whole.  ``--resume`` continues its run's log
(:func:`resumed_lines`): the lines past the checkpoint's step, and the summary, are dropped
and the run appends to the rest, so every step appears once; a log of another run is refused
at start (:func:`check_resume_log`, from the preflight).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from cpu_dist.common.files import OutputError
from cpu_dist.common.metrics_log import MetricsLog, MetricsLogError, header, read_log, read_records

if TYPE_CHECKING:
    from cpu_dist.common.config import Config


def _jsonable(value: Any) -> Any:
    """numpy scalars/arrays and non-finite floats -> plain JSON (NaN/inf become null)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_summary(path: str | os.PathLike) -> dict[str, Any]:
    """The ``{"summary": ...}`` record of a finished run's JSON-lines log (the last one), for
    the benchmarks and tests that read what a job reported."""
    found = [r["summary"] for r in read_records(path) if "summary" in r]
    if not found:
        raise ValueError(f"{path}: no summary line (the run did not finish)")
    return found[-1]


def json_line(record: Mapping[str, Any]) -> str:
    """A record as one line of a log (numpy values made plain, NaN and inf null)."""
    return json.dumps(_jsonable(record), allow_nan=False) + "\n"


def append_record(path: str | os.PathLike, record: Mapping[str, Any], run_id: str) -> None:
    """One record added at the end of the log at ``path`` (a program that reports once, as
    the single-process reference); a missing or empty log starts with the header of
    ``run_id``."""
    with open(path, "a", encoding="utf-8") as f:
        f.write((json_line(header(run_id)) if f.tell() == 0 else "") + json_line(record))


class JsonLinesWriter:
    """One JSON object per line, flushed after each, so the file is always readable.

    The file is made at the first record, not before: ``start`` (a header, and the lines a
    resumed run keeps of its log) and that record go to a temporary sibling, fsynced, which
    then replaces ``path``.  A job that fails before its first record leaves the file that
    was there untouched, and a crash during the rewrite leaves it whole."""

    def __init__(self, path: str | os.PathLike, start: Sequence[str] = ()) -> None:
        self.path = os.fspath(path)
        self._start = list(start)
        self._fh: IO[str] | None = None
        self._closed = False

    def write(self, record: Mapping[str, Any]) -> None:
        if self._closed:
            raise ValueError(f"{self.path} is closed")
        line = json_line(record)
        if self._fh is None:
            self._fh = self._replace([*self._start, line])
            return
        self._fh.write(line)
        self._fh.flush()

    def _replace(self, lines: list[str]) -> IO[str]:
        """``lines`` written to a temporary sibling that then replaces ``path``; the open
        file, for the records after them.  A ``path`` that is a symbolic link is written
        where it points (the link stays), as opening it for writing would."""
        self.path = os.path.realpath(self.path)
        parent = os.path.dirname(self.path) or "."
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{os.path.basename(self.path)}.tmp-{secrets.token_hex(4)}")
        # (os.open, not mkstemp: the log gets the umask's mode, as open() would give it)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        fh = os.fdopen(fd, "w", encoding="utf-8")
        try:
            fh.writelines(lines)
            fh.flush()
            os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            fh.close()
            Path(tmp).unlink(missing_ok=True)
            raise
        return fh

    def close(self) -> None:
        self._closed = True
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> JsonLinesWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardWriter:
    """Scalars to TensorBoard when ``torch.utils.tensorboard`` can be imported, else nothing.

    TensorBoard is optional (it pulls in a large package); a run must not fail for lack of it.
    ``purge_step`` (a resumed run: the first step it logs): TensorBoard drops the run's
    earlier events at or past it, as the JSON-lines log drops its lines.
    """

    def __init__(self, logdir: str | os.PathLike, purge_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as exc:
            import sys

            print(
                f"cpu_dist: --tensorboard {os.fspath(logdir)}: TensorBoard is not available "
                f"({exc}); writing JSON lines only",
                file=sys.stderr,
                flush=True,
            )
            self._writer = None
        else:
            self._writer = SummaryWriter(os.fspath(logdir), purge_step=purge_step)
        # The last step line's step and phase seconds: a phase's curve is its milliseconds
        # per step since then (the run's PhaseTimer starts at 0, a resumed run's too).
        self._phase_at = 0 if purge_step is None else purge_step - 1
        self._phase_s: dict[str, float] = {}

    @property
    def available(self) -> bool:
        return self._writer is not None

    def write(self, record: Mapping[str, Any]) -> None:
        if self._writer is None or "step" not in record:
            return
        step = int(record["step"])
        for tag, value in self.scalars(record):
            self._writer.add_scalar(tag, value, step)

    def scalars(self, record: Mapping[str, Any]) -> list[tuple[str, float]]:
        """A record's numbers as ``(tag, value)``, grouped (:func:`tensorboard_tag`); its
        phase seconds (``t_<phase>``, cumulative) as ``phase_ms/<phase>``, milliseconds per
        step over the steps since the last step line."""
        step = int(record["step"])
        out: list[tuple[str, float]] = []
        steps = step - self._phase_at
        phases = {k[2:]: float(v) for k, v in record.items() if k.startswith("t_")}
        for key, value in record.items():
            if key == "step" or key.startswith("t_") or not _number(value):
                continue
            out.append((tensorboard_tag(key), float(value)))
        if phases and steps > 0:
            for name, secs in phases.items():
                per_step = (secs - self._phase_s.get(name, 0.0)) * 1e3 / steps
                out.append((f"phase_ms/{name}", per_step))
            self._phase_at, self._phase_s = step, phases
        return out

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


# Step-line keys that are the training's own figures (train/), beside the loss, throughput
# and train_*; every other counter of a step line is the sparse side's (ps/).
TRAIN_KEYS = ("loss", "samples_per_s", "bytes_allreduced", "dense_optimizer_state_bytes")


def tensorboard_tag(key: str) -> str:
    """A record key's TensorBoard tag, in groups: ``train/`` (loss, throughput, train AUC and
    NE, the dense side's bytes), ``eval/`` and ``test/`` (each evaluation's figures, a
    ``--metric`` too), ``lr/`` (``lr``: ``lr/dense``; ``lr_<table>``: ``lr/table/<table>``)
    and ``ps/`` (every other counter: the parameter servers' traffic, commits and reads);
    ``phase_ms/`` is made from the ``t_`` keys (:meth:`TensorBoardWriter.scalars`)."""
    for prefix in ("eval_", "test_", "train_"):
        if key.startswith(prefix):
            return f"{prefix[:-1]}/{key[len(prefix) :]}"
    if key == "lr":
        return "lr/dense"
    if key.startswith("lr_"):
        return f"lr/table/{key[3:]}"
    if key in TRAIN_KEYS:
        return f"train/{key}"
    return f"ps/{key}"


def learning_rates(cfg: Config, step: int) -> dict[str, float]:
    """The learning rates job step ``step`` (0-based) ran with: ``lr`` the dense optimizer's,
    ``lr_<table>`` each table's (``common.schedule``, which every part reads them from)."""
    t = cfg.train
    out = {"lr": t.schedule.rate(t.lr, step)}
    for table in cfg.tables.tables:
        out[f"lr_{table.name}"] = t.schedule.rate(table.lr, step)
    return out


def record_step(record: Mapping[str, Any]) -> int | None:
    """The step a record belongs to: its ``step``; None for other records."""
    step = record.get("step")
    return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else None


def log_to_resume(path: str | os.PathLike, run_id: str) -> MetricsLog | None:
    """The log at ``path`` that a resume of run ``run_id`` continues: None when there is none
    (missing or empty).  OutputError, naming ``--metrics-out``, the file and both runs, when
    it is another run's (a log without a header, of an older version, is taken), or when a
    line of it is not JSON."""
    try:
        if os.path.getsize(path) == 0:
            return None
        log = read_log(path)
    except FileNotFoundError:
        return None
    except MetricsLogError as exc:
        raise OutputError(f"--metrics-out {exc}: cannot continue this log") from None
    except OSError as exc:
        raise OutputError(f"--metrics-out {os.fspath(path)}: {exc.strerror}") from None
    if log.run is not None and log.run != run_id:
        raise OutputError(
            f"--metrics-out {os.fspath(path)}: is the log of run {log.run}, not of run "
            f"{run_id} that --resume continues; give another --metrics-out (or remove the "
            "file yourself)"
        )
    return log


def resumed_lines(path: str | os.PathLike, run_id: str, step: int) -> list[str]:
    """The lines a run resumed after ``step`` steps starts its log with: its header, then
    the records of its log (:func:`log_to_resume`) up to ``step`` as they were written.
    Records past ``step`` (written after the checkpoint, which the run does again) and the
    summary (the run has not ended) are dropped, so no step appears twice."""
    log = log_to_resume(path, run_id)
    kept = []
    if log is not None:
        for record, line in zip(log.records, log.lines):
            at = record_step(record)
            if "summary" not in record and (at is None or at <= step):
                kept.append(line + "\n")
    return [json_line(header(run_id)), *kept]


def check_resume_log(cfg: Config) -> None:
    """At start, before anything is written: a ``--resume`` from a checkpoint refuses a
    ``--metrics-out`` log of another run (OutputError) instead of appending to it."""
    out, ck = cfg.output.metrics_out, cfg.checkpoint
    if not (out and ck.resume and ck.dir):
        return
    from cpu_dist.checkpoint.manifest import find_latest

    latest = find_latest(Path(ck.dir).resolve())
    if latest is not None and latest.run_id:
        log_to_resume(out, latest.run_id)


class RunLog:
    """The run's metric sinks: JSON lines at ``path`` and TensorBoard at ``tensorboard_dir``,
    each optional (None: off), so non-chief ranks can hold a RunLog that writes nothing.

    ``run_id``: the log starts with its header.  ``resume_at``: the run resumed after that
    many steps, and continues its log (:func:`resumed_lines`) and its TensorBoard run (whose
    events past that step TensorBoard drops)."""

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        tensorboard_dir: str | os.PathLike | None = None,
        run_id: str | None = None,
        resume_at: int | None = None,
    ) -> None:
        start: list[str] = []
        if path and run_id is not None:
            start = (
                [json_line(header(run_id))]
                if resume_at is None
                else resumed_lines(path, run_id, resume_at)
            )
        self.jsonl = JsonLinesWriter(path, start) if path else None
        purge = None if resume_at is None else resume_at + 1
        self.tensorboard = (
            TensorBoardWriter(tensorboard_dir, purge_step=purge) if tensorboard_dir else None
        )

    def write(self, record: Mapping[str, Any]) -> None:
        if self.jsonl is not None:
            self.jsonl.write(record)
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def close(self) -> None:
        for sink in (self.jsonl, self.tensorboard):
            if sink is not None:
                sink.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Window:
    """Samples per second, and the loss, over the steps since the last logged line."""

    def __init__(self, t0: float) -> None:
        self.t0, self.samples = t0, 0
        self.loss_sum, self.losses = 0.0, 0

    def add_loss(self, loss: float) -> None:
        self.loss_sum += loss
        self.losses += 1

    def take_loss(self) -> list[float]:
        """[sum of the interval's losses, their number], and a new interval."""
        out = [self.loss_sum, float(self.losses)]
        self.loss_sum, self.losses = 0.0, 0
        return out

    def rate(self, now: float) -> float:
        rate = self.samples / max(now - self.t0, 1e-9)
        self.t0, self.samples = now, 0
        return rate

    def pause(self, seconds: float) -> None:
        """Time spent on something else (an evaluation): not counted in the rate."""
        self.t0 += seconds


class TrainScores:
    """Train AUC and NE (``train_auc``, ``train_ne``) over the last ``window`` steps' rows of
    every worker, at each logged step.

    Each worker keeps its own share's logits and labels of the last ``window`` steps; at a
    logged step (:meth:`figures`, a collective) it sends worker 0 those it has not sent, and
    worker 0 keeps the global batches, each in the data's order (ranks' shares in rank
    order), so the figures do not depend on the number of workers.  A resumed run's window
    starts empty."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._mine: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=window)
        self._unsent = 0
        self._steps: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=window)

    def add(self, logits: np.ndarray, labels: np.ndarray) -> None:
        """One step's logits and labels of this worker's share."""
        self._mine.append((np.asarray(logits, np.float64), np.asarray(labels, np.float64)))
        self._unsent = min(self._unsent + 1, self.window)

    def figures(self, comm: Any) -> dict[str, float]:
        """Every worker calls it at the same logged step; ``{"train_auc", "train_ne"}`` on
        worker 0 (empty elsewhere)."""
        from cpu_dist.models.scoring import auc, normalized_entropy, probabilities

        fresh = list(self._mine)[len(self._mine) - self._unsent :]
        self._unsent = 0
        gathered = comm.gather(fresh, root=0)
        if gathered is None:
            return {}
        for shares in zip(*gathered):  # one step: each worker's share, in rank order
            self._steps.append(
                (np.concatenate([x[0] for x in shares]), np.concatenate([x[1] for x in shares]))
            )
        if not self._steps:
            return {}
        s = np.concatenate([x[0] for x in self._steps])
        y = np.concatenate([x[1] for x in self._steps])
        logloss = float(np.mean(np.logaddexp(0.0, s) - y * s))
        return {
            "train_auc": auc(probabilities(s), y, np.float32),  # (float32: the faster one)
            "train_ne": normalized_entropy(logloss, float(y.mean())),
        }
