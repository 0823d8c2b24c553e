"""Worker 0's progress on the console: a tqdm bar on a terminal, one line every
``--print-freq`` steps elsewhere, and console lines that do not tear the bar."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from cpu_dist.common.procfs import proc_stat


def console(line: str) -> None:
    """A line on stdout that does not tear the progress bar (tqdm moves it below)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def progress(total: int | None, enabled: bool = True, **kwargs: Any):
    """A tqdm progress bar, or a silent stand-in with the same methods when disabled."""
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, dynamic_ncols=True, **kwargs)


# The programs that start a job's ranks on this node: a rank's stderr is their pipe, so
# whether the user sees a terminal is whether theirs is one.
LAUNCHERS = frozenset({"mpirun", "mpiexec", "orterun", "prterun"})


def _stat(proc: Path, pid: int) -> tuple[str, int] | None:
    """``(command name, parent pid)`` of ``pid`` from ``proc``/PID/stat, or None."""
    found = proc_stat(pid, proc)
    try:
        return (found[0], int(found[1][1])) if found is not None else None
    except (ValueError, IndexError):
        return None


def _tty_path(link: str) -> bool:
    return link.startswith(("/dev/pts/", "/dev/tty", "/dev/console"))


def on_terminal(proc: str | os.PathLike = "/proc", pid: int | None = None, stderr=None) -> bool:
    """Whether the user watches this rank's progress on a terminal: its stderr is one, or
    else (under mpirun its stderr is a pipe to mpirun, its stdout a pseudo-terminal
    whatever mpirun's own is) the stderr of the launcher it descends from (``LAUNCHERS``,
    up to four generations) is one.  False where that cannot be told (srun, another node)."""
    stream = sys.stderr if stderr is None else stderr
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):
        pass
    root = Path(proc)
    at = os.getppid() if pid is None else pid
    for _ in range(4):
        found = _stat(root, at)
        if found is None:
            return False
        name, parent = found
        if name in LAUNCHERS:
            try:
                return _tty_path(os.readlink(root / str(at) / "fd" / "2"))
            except OSError:
                return False
        at = parent
    return False


class Progress:
    """Worker 0's progress: on a terminal a tqdm bar (steps, the loss and the run's average
    samples/s, evaluation time excluded); otherwise no bar frames (a log would collect one
    carriage-return frame per step) but one line every ``--print-freq`` steps."""

    def __init__(self, total: int, start: int, enabled: bool, terminal: bool | None = None):
        self.total = total
        self.terminal = enabled and (on_terminal() if terminal is None else terminal)
        self.lines = enabled and not self.terminal
        bar_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
        self.bar = progress(total, self.terminal, initial=start, bar_format=bar_format)

    def logged(self, step: int, loss: float, samples_per_s: float) -> None:
        """A logged step: its loss and the run's average samples/s so far."""
        if self.terminal:
            self.bar.set_postfix(loss=f"{loss:.4f}", sps=f"{samples_per_s:,.0f}", refresh=False)
        elif self.lines:
            console(
                f"step {step}/{self.total}: loss {loss:.4f}  {samples_per_s:,.0f} samples/s "
                "(run average)"
            )

    def update(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
