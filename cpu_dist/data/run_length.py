"""How many steps a job trains, decided once before training and said at the start.

Synthetic data never ends: ``--max_step`` (300 by default).  File data trains ``--epochs``
passes (one by default) unless ``--max_step`` is given: alone it decides (the passes go on
until it), with ``--epochs`` whichever ends first.  A run that cannot train one step (a global
batch larger than the training split, an empty file) is an error naming the sizes, never a
run that succeeds doing nothing."""

from __future__ import annotations

from dataclasses import dataclass

from cpu_dist.common.config import DataConfig, TrainConfig
from cpu_dist.data.file_dataset import FileDataset


class RunLengthError(ValueError):
    """The data and the flags leave no step to train; the message names the sizes."""


@dataclass(frozen=True)
class RunLength:
    steps: int
    why: str  # for the line the job prints at the start

    def describe(self, start: int = 0) -> str:
        """The start line; a run resumed after ``start`` steps says what remains."""
        if start > 0:
            return (
                f"resuming at step {start:,}: training {self.steps - start:,} more steps "
                f"(to step {self.steps:,}): {self.why}"
            )
        return f"training {self.steps:,} steps: {self.why}"


def run_length(train: TrainConfig, data: DataConfig, dataset: object) -> RunLength:
    """The job's step count and the reason for it; RunLengthError when it is none."""
    m, b = train.max_step, train.batch_size
    if not isinstance(dataset, FileDataset):
        why = f"--max_step {m}" if train.max_step_given else f"the default --max_step {m}"
        return RunLength(m, why + " (the synthetic stream never ends)")
    rows, per_epoch = dataset.train_rows(), dataset.steps_per_epoch(b)
    split = f"{rows:,} training rows of --data-path {data.path} / --batch-size {b:,}"
    if per_epoch == 0:
        raise RunLengthError(
            f"--batch-size {b:,} is larger than the training split ({rows:,} rows of "
            f"--data-path {data.path}): not one step can be trained; give a smaller "
            "--batch-size or more data"
        )
    epoch = f"{per_epoch:,} steps per epoch ({split})"
    if data.epochs is None:
        return RunLength(m, f"--max_step {m} ({m / per_epoch:.3g} epochs of {epoch})")
    total = data.epochs * per_epoch
    if train.max_step_given and m < total:
        return RunLength(
            m, f"--max_step {m}, before the end of --epochs {data.epochs} ({total:,} steps)"
        )
    why = f"--epochs {data.epochs} x {epoch}"
    if train.max_step_given:
        why += f"; --max_step {m} is beyond them"
    return RunLength(total, why)
