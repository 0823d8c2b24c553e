"""Only the first rank speaks: every rank of a job parses the same argv before MPI is up, and
reaches the same verdict; rank 0 alone prints it (``launcher.py``'s flags, the checks'
warnings)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, NoReturn

# Where a launcher puts the task's rank before MPI_Init (OpenMPI's mpirun, PMIx, MPICH's hydra,
# srun): argparse runs before MPI is up, and only the first rank should speak for all.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def launch_rank(environ: Mapping[str, str] | None = None) -> int:
    """This task's rank as its launcher announced it (0 when started alone)."""
    env = os.environ if environ is None else environ
    for name in _RANK_VARS:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


class FirstRankParser(argparse.ArgumentParser):
    """Every rank parses the same argv and reaches the same verdict; only rank 0 prints it
    (usage, an unknown flag, --help), so a bad flag is reported once, not by every rank.

    The other ranks leave with status 0: MPI is not initialised yet, and mpirun kills the
    remaining ranks as soon as one exits non-zero, which could be before rank 0 has printed
    the message.  The job's status is rank 0's (2)."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if launch_rank() == 0:
            super()._print_message(message, file)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        super().exit(status if launch_rank() == 0 else 0, message)

    def error(self, message: str) -> NoReturn:
        """One line, as every other refusal of a flag (not argparse's usage dump of every
        flag before it): the flag, what is wrong, and where the flags are listed."""
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")
