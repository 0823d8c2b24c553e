"""Run launcher.py under a real mpirun, as users do, and read back its --dump-state."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from cpu_dist.common.config import Config
from cpu_dist.common.flags import parse_args
from cpu_dist.common.launch_env import mpi_env
from cpu_dist.common.validate import validate
from cpu_dist.reference import train_reference
from cpu_dist.train.dump import table_rows

ROOT = Path(__file__).resolve().parents[2]
MPI_ENV = {**mpi_env(), "PYTHONUNBUFFERED": "1"}  # this environment + scripts/env.sh
# A small model so a 20-step run takes seconds on two cores.
SMALL = [
    "--embedding-dim",
    "8",
    "--arch-mlp-bot",
    "16-8",
    "--arch-mlp-top",
    "16-1",
    "--batch-size",
    "96",
    "--max_step",
    "20",
    "--lr",
    "0.1",
    "--no-progress",
    "--eval-every",
    "0",
    "--eval-batches",
    "1",
    "--print-freq",
    "5",
]


def reference_config(flags: Sequence[str] = (), workers: int = 1, shards: int = 1) -> Config:
    """The Config a job of ``SMALL`` + ``flags`` runs with (parsed and checked as the launcher
    does), for the single-process reference."""
    return validate(parse_args(["--worker-num", str(workers), *SMALL, *flags]), workers + shards)


def small_reference(
    dataset,
    steps: int = 20,
    batch_size: int = 96,
    sparse_optimizer: str = "sgd",
    dense_optimizer: str = "sgd",
    flags: Sequence[str] = (),
    **rules: int,
) -> dict:
    """The single-process reference of a ``SMALL`` job (``cpu_dist.reference``) on
    ``dataset``; ``rules``: admit_after, expire_after (``--ps-admit-after``,
    ``--ps-expire-after``)."""
    extra = [
        "--batch-size",
        str(batch_size),
        "--sparse-optimizer",
        sparse_optimizer,
        "--dense-optimizer",
        dense_optimizer,
        *flags,
    ]
    for rule, flag in (("admit_after", "--ps-admit-after"), ("expire_after", "--ps-expire-after")):
        if rules.get(rule):
            extra += [flag, str(rules[rule])]
    return train_reference(reference_config(extra), dataset, steps)


def with_flags(flags: Sequence[str], changes: dict[str, str | None]) -> list[str]:
    """``flags`` with each named flag's value replaced (appended when absent; ``None``: the
    flag and its value removed), so tests vary SMALL without a second copy of it."""
    out = list(flags)
    for name, value in changes.items():
        if name in out:
            i = out.index(name)
            out[i : i + 2] = [] if value is None else [name, value]
        elif value is not None:
            out += [name, value]
    return out


def external_job(
    token_file: str, addresses: Sequence[str], *extra: str, workers: int = 1
) -> subprocess.CompletedProcess:
    """A SMALL job of ``workers`` ranks, all workers, on shards started elsewhere."""
    args = ["--worker-num", str(workers), "--ps_list", ",".join(addresses)]
    return mpirun(workers, [*args, "--token-file", token_file, *SMALL, *extra])


def run_module(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in the checkout, as a user runs the tools (export, serving)."""
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def mpirun(
    np_: int, args: list[str], timeout: float = 240, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``mpirun -np NP launcher.py ARGS`` with this environment, MPI_ENV and ``env``."""
    env = {**os.environ, **MPI_ENV, **(env or {})}
    cmd = ["mpirun", "-np", str(np_), sys.executable, str(ROOT / "launcher.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# ---- train(): one job per distinct run in the session ------------------------------------
#
# Several test files train the very same job (the same flags, data and environment) and read
# only what it wrote (its --dump-state and --metrics-out): train() runs each such job once per
# pytest session and gives later callers copies of its files.  Anything that could make two
# runs differ is in the key; a job that reads or writes state outside those two files is never
# shared.

# Files a job writes that train() copies; their paths are no part of what the job computes.
_OUTPUTS = ("dump_state", "metrics_out")
# Parsed flags that are not part of what the job computes (what the user named; the job file
# read: its contents are in the key as --config's).
_NOT_RESULT = ("given", "job_file")
# Flags naming state outside the dump and the metrics (a checkpoint to resume, shards started
# elsewhere, working storage a test inspects, other outputs): a job with any set is not shared.
_STATEFUL = (
    "checkpoint_dir",
    "resume",
    "ps_list",
    "token_file",
    "ps_ssd_dir",
    "export",
    "tensorboard",
)
# Set by pytest, per test: no part of a job.
_NOT_JOB_ENV = ("PYTEST_CURRENT_TEST",)
_runs: dict[tuple, tuple[Path, Path]] = {}


def _cache_dir() -> Path:
    """The session's private copies of the shared jobs' files (gone when the session ends)."""
    if not hasattr(_cache_dir, "path"):
        path = Path(tempfile.mkdtemp(prefix="cpu-dist-train-runs-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _cache_dir.path = path  # type: ignore[attr-defined]
    return _cache_dir.path  # type: ignore[attr-defined]


def _value_key(value: object) -> object:
    """A flag's value as it bears on the job: a file it names (absolute, or relative to the
    job's working directory) by its contents, so the same data or job file under another path
    is the same job and other data under the same path another; an absolute path that is no
    file (a directory, an output to be made) makes the job one not to share (LookupError)."""
    if isinstance(value, str) and os.path.isabs(value) and not os.path.isfile(value):
        raise LookupError(value)  # a directory or a path to be made: state, not shared
    if isinstance(value, str) and (ROOT / value).is_file():  # absolute, or the job's cwd's
        return ("file", hashlib.sha256((ROOT / value).read_bytes()).hexdigest())
    if isinstance(value, list):
        return tuple(_value_key(v) for v in value)
    return value


def run_key(np_: int, args: Sequence[str], env: Mapping[str, str]) -> tuple | None:
    """What decides the result of ``mpirun -np NP launcher.py ARGS`` in this environment plus
    ``env``: the rank count, every parsed flag (defaults included, so the order of the flags
    and a flag given at its default change nothing) but the output paths, the contents of the
    files named, and the environment; ``None`` for a job that must not be shared."""
    try:
        parsed = vars(parse_args(list(args)))
    except SystemExit:  # flags the launcher refuses: the job says why when it runs
        return None
    if any(parsed.get(dest) for dest in _STATEFUL):
        return None
    try:
        flags = tuple(
            sorted(
                (dest, _value_key(value))
                for dest, value in parsed.items()
                if dest not in _OUTPUTS and dest not in _NOT_RESULT
            )
        )
    except LookupError:
        return None
    job_env = {**os.environ, **MPI_ENV, **env}
    environment = tuple(sorted((k, v) for k, v in job_env.items() if k not in _NOT_JOB_ENV))
    return (np_, flags, environment)


def train(
    tmp: Path,
    name: str,
    workers: int,
    shards: int,
    extra: Sequence[str] = (),
    *,
    fresh: bool = False,
    env: Mapping[str, str] | None = None,
) -> dict:
    """The --dump-state arrays of a job of ``workers`` + ``shards`` ranks (SMALL, ``extra``)
    in ``tmp/NAME.npz``, its metrics log at its --metrics-out when ``extra`` names one.  The
    same job run before in this session is not run again (see run_key) unless ``fresh``; its
    files are copied to the paths asked for, as the job would have written them."""
    out = tmp / f"{name}.npz"
    extra = list(extra)
    named = [i for i, a in enumerate(extra) if a.split("=")[0] == "--metrics-out"]
    if named:  # the last one counts, as in argparse
        i = named[-1]
        metrics = Path(extra[i].partition("=")[2] or extra[i + 1])
    else:  # every run writes one, so that a later caller asking for it can share the run
        metrics = tmp / f"{name}.metrics.jsonl"
        extra += ["--metrics-out", str(metrics)]
    args = ["--worker-num", str(workers), *SMALL, *extra, "--dump-state", str(out)]
    key = run_key(workers + shards, args, env or {})
    if key in _runs and not fresh:
        for have, want in zip(_runs[key], (out, metrics)):
            shutil.copyfile(have, want)
    else:
        proc = mpirun(workers + shards, args, env=env)
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        if key is not None:
            keep = Path(tempfile.mkdtemp(dir=_cache_dir()))
            _runs[key] = (
                Path(shutil.copyfile(out, keep / "dump.npz")),
                Path(shutil.copyfile(metrics, keep / "metrics.jsonl")),
            )
    return load_dump(out)


def cli_reference(args: Sequence[str], out: Path) -> dict:
    """``python -m cpu_dist.reference`` on a job's flags: its ``--dump-state``."""
    done = subprocess.run(
        [sys.executable, "-m", "cpu_dist.reference", *SMALL, *args, "--dump-state", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return load_dump(out)


def load_dump(path: Path) -> dict[str, np.ndarray]:
    """A ``--dump-state`` file as a dict of its arrays (the file closed again)."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def assert_dumps_close(
    got: Mapping[str, np.ndarray],
    want: Mapping[str, np.ndarray],
    rtol: float,
    what: str = "",
    *,
    atol: float = 1e-6,
) -> None:
    """Every entry of two ``--dump-state`` dicts: the same entries, every table's keys equal,
    every array to ``rtol``/``atol``.  The suite's one tolerant comparison of two dumps, so
    that no test compares a part of them by accident (say one table's keys of several)."""
    _same_entries_and_keys(got, want, what)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=f"{what}: {k}")


def assert_dumps_equal(
    got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], what: str = ""
) -> None:
    """Two ``--dump-state`` dicts bit for bit: the same entries, each with the same dtype,
    shape and bytes.  Bytes, not values: ``-0.0 == 0.0`` as values, and a run said to give
    the same bits must give them."""
    _same_entries_and_keys(got, want, what)
    for k in want:
        a, b = got[k], want[k]
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (
            f"{what}: {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        )
        if a.tobytes() != b.tobytes():
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: {k}")  # says where they differ
            raise AssertionError(f"{what}: {k}: equal values, different bits (signed zero or NaN)")


def _same_entries_and_keys(
    got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], what: str
) -> None:
    """The same entries, and every table's keys equal: a row's values compared under another
    row's id would say nothing."""
    assert set(got) == set(want), f"{what}: different entries: {set(got) ^ set(want)}"
    assert want, f"{what}: the dumps hold no arrays"
    for name, (keys, _) in table_rows(want).items():
        np.testing.assert_array_equal(table_rows(got)[name][0], keys, err_msg=f"{what}: {name}")
