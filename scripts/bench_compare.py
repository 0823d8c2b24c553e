#!/usr/bin/env python
"""Before and after: one benchmark at revision REV against the working tree, in one invocation.

    scripts/bench_compare.py REV [--rounds N] -- BENCH [ARGS...]

REV is checked out in a git worktree beside this checkout (``build/bench-base/<commit>``,
ignored by git) and its native extensions are built there with CMake, never touching this
checkout's ``.venv`` install or ``build/`` tree; a finished base build is reused (a stamp
file records it).  Then REV's own copy of BENCH runs there and the working tree's copy runs
here, with the same arguments and the same Python, in N interleaved rounds (base, head, base,
head, ...) so that the load of a shared machine falls on both alike.

What is read from a benchmark: the last line of its standard output, one JSON object (every
``scripts/bench_*.py`` ends that way, CONTRIBUTING.md).  Its numeric values are the figures;
nested objects give dotted keys (``phase_ms_per_step_w1.data``); strings, booleans, nulls and
lists are not figures.  The last line printed here is one JSON object::

    {"base": REV, "rounds": N,
     "keys": {KEY: {"head": MEDIAN, "base": MEDIAN, "ratio": H/B, "spread": [LOW, HIGH]}}}

over the keys both sides printed in every round (ratio null where the base median is 0).
``spread`` is the lowest and highest ratio of one round's head to the same round's base (the
two runs nearest in time; null where a base figure is 0): on a shared machine a ratio whose
spread straddles 1.0 is no verdict, however far the medians' ratio is from it.
Lines before it show each round and the keys only one side printed.  Every run's output is
kept under the base folder's ``logs/``.  Errors (an unknown REV, BENCH missing on one side, a
failed build or run, no figures in common) are one line ``bench_compare: error: ...`` and a
non-zero exit: 2 for the command line, 1 for the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD_LOCK = Path("/tmp/cpu_dist_build.lock")  # scripts/build.sh holds the same lock
STAMP = ".bench-compare-stamp"
LOCK_TIMEOUT_S = 1800.0  # waiting for another build (scripts/build.sh, or a comparison)
BUILD_STEP_TIMEOUT_S = 3600.0  # one CMake step; a full build takes about a minute here
QUICK_TIMEOUT_S = 300.0  # a git call, an import check
# The native modules a base tree must hold before its benchmarks can run (CMakeLists.txt
# installs them beside their packages).
NATIVE = ("cpu_dist.sparse._ps", "gpu_cache._metadata")
# Put first on a base run's PYTHONPATH: without it the editable install of this checkout
# (scikit-build-core's import redirector, loaded from a .pth file before PYTHONPATH is
# consulted) would serve this checkout's cpu_dist to REV's benchmark and to every process it
# starts.  The redirector of another checkout is dropped; nothing else changes.
SITECUSTOMIZE = """\
import sys
sys.meta_path[:] = [
    f for f in sys.meta_path
    if not (type(f).__name__ == "ScikitBuildRedirectingFinder"
            and "cpu_dist" in getattr(f, "known_source_files", {}))
]
"""


class CompareError(Exception):
    """One line for the user; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# ---- figures: parsing and summing up (no git, no builds) -------------------------------


def figures(stdout: str) -> dict[str, float]:
    """The numeric figures of one benchmark run: its last output line, a JSON object."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("it printed nothing on standard output")
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise ValueError(f"its last line is not a JSON object: {lines[-1][:120]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"its last line is JSON but not an object: {lines[-1][:120]!r}")
    out: dict[str, float] = {}
    _flatten(obj, "", out)
    return out


def _flatten(obj: Mapping, prefix: str, out: dict[str, float]) -> None:
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, name + ".", out)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                out[name] = float(value)


def common_keys(runs: Sequence[dict[str, float]]) -> list[str]:
    """The keys every run printed, in the order the first run printed them."""
    if not runs:
        return []
    rest = [set(r) for r in runs[1:]]
    return [k for k in runs[0] if all(k in r for r in rest)]


def summary(rev: str, head: Sequence[dict[str, float]], base: Sequence[dict[str, float]]) -> dict:
    """The result object: per key both sides printed in every round, the medians and their
    ratio head/base (None where the base median is 0), and the spread of the rounds' own
    ratios (head and base of one round ran back to back), which says how much of the
    medians' ratio the machine's noise could be."""
    if len(head) != len(base) or not head:
        raise ValueError("head and base need the same number of rounds, at least one")
    keys: dict[str, dict] = {}
    for k in common_keys([*head, *base]):
        h = statistics.median(r[k] for r in head)
        b = statistics.median(r[k] for r in base)
        paired = [rh[k] / rb[k] for rh, rb in zip(head, base) if rb[k] != 0]
        spread = (
            [round(min(paired), 4), round(max(paired), 4)] if len(paired) == len(head) else None
        )
        keys[k] = {
            "head": h,
            "base": b,
            "ratio": round(h / b, 4) if b != 0 else None,
            "spread": spread,
        }
    return {"base": rev, "rounds": len(head), "keys": keys}


def one_sided(head: Sequence[dict[str, float]], base: Sequence[dict[str, float]]) -> list[str]:
    """Lines naming the keys only one side printed in every round (renamed or new figures)."""
    h, b = set(common_keys(head)), set(common_keys(base))
    out = []
    if h - b:
        out.append("only in head: " + ", ".join(sorted(h - b)))
    if b - h:
        out.append("only in base: " + ", ".join(sorted(b - h)))
    return out


# ---- the base tree: worktree, build, checks --------------------------------------------


def git(*args: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=QUICK_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise CompareError(f"git {' '.join(args)} failed: {_last_line(proc.stderr)}")
    return proc.stdout.strip()


def resolve(rev: str) -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise CompareError(f"unknown revision {rev!r} (not a commit of {ROOT})", 2)
    return proc.stdout.strip()


def bench_path(bench: str) -> str:
    """BENCH as a path inside the repository, the same on both sides."""
    p = Path(bench)
    if not p.is_absolute():
        p = Path.cwd() / p
    p = p.resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        raise CompareError(f"{bench} is not inside the checkout {ROOT}", 2) from None


def check_bench(rel: str, commit: str, rev: str) -> None:
    if not (ROOT / rel).is_file():
        raise CompareError(f"{rel} does not exist in the working tree", 2)
    listed = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}:{rel}"],
        cwd=ROOT,
        capture_output=True,
        timeout=QUICK_TIMEOUT_S,
    )
    if listed.returncode != 0:
        raise CompareError(f"{rel} does not exist in {rev} ({commit[:12]})", 2)


@contextlib.contextmanager
def locked(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """``path`` locked (flock) for the block; CompareError after ``timeout_s`` of waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CompareError(f"{path} stayed locked for {timeout_s:g} s") from None
                time.sleep(0.5)  # another build holds it: poll, no busy wait
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def base_env(tree: Path) -> dict[str, str]:
    """The environment of a base run: REV's packages first, this checkout's redirector off."""
    shim = tree.parent / f"{tree.name}.site"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(shim), str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return env


def check_imports(tree: Path, python: str) -> None:
    """REV's cpu_dist and native modules resolve inside the tree, or the run would measure
    this checkout twice."""
    code = "import json, importlib, cpu_dist\n" + (
        "print(json.dumps([cpu_dist.__file__] + "
        f"[importlib.import_module(m).__file__ for m in {list(NATIVE)!r}]))"
    )
    proc = subprocess.run(
        [python, "-c", code],
        cwd=tree,
        env=base_env(tree),
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise CompareError(f"the base tree {tree} does not import: {_last_line(proc.stderr)}")
    for f in json.loads(proc.stdout.strip().splitlines()[-1]):
        if not Path(f).resolve().is_relative_to(tree.resolve()):
            raise CompareError(f"the base run would import {f}, outside the base tree {tree}")


def _stamp_matches(tree: Path, commit: str, python: str) -> bool:
    try:
        stamp = json.loads((tree / STAMP).read_text())
    except (OSError, ValueError):
        return False
    if stamp != {"commit": commit, "python": python}:
        return False
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )
    return head.returncode == 0 and head.stdout.strip() == commit


def prepare_base(commit: str, work: Path, python: str, log: Path) -> Path:
    """The worktree of ``commit`` with its extensions built (reused when its stamp says so)."""
    tree = work / commit
    with locked(work / f"{commit}.lock"):  # two comparisons of one REV build it once
        shim = tree.parent / f"{tree.name}.site"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
        if _stamp_matches(tree, commit, python):
            print(f"base {commit[:12]}: reusing the build in {tree}", flush=True)
        else:
            if tree.exists():  # an unfinished attempt: start again
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree)],
                    cwd=ROOT,
                    timeout=QUICK_TIMEOUT_S,
                )
                shutil.rmtree(tree, ignore_errors=True)
            git("worktree", "prune")
            git("worktree", "add", "--detach", str(tree), commit)
            build(tree, python, log)
            check_imports(tree, python)  # before the stamp: a stamp means a usable tree
            (tree / STAMP).write_text(json.dumps({"commit": commit, "python": python}))
            return tree
        check_imports(tree, python)
    return tree


def build(tree: Path, python: str, log: Path) -> None:
    """REV's CMake project into ``tree/build/bench-compare``, its modules installed into the
    tree's packages (where CMakeLists.txt's install() rules put them)."""
    out = tree / "build" / "bench-compare"
    pybind = subprocess.run(
        [python, "-m", "pybind11", "--cmakedir"],
        capture_output=True,
        text=True,
        check=True,
        timeout=QUICK_TIMEOUT_S,
    ).stdout.strip()
    steps = [
        (
            "cmake configure",
            [
                *("cmake", "-S", str(tree), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release"),
                *(f"-DPython_EXECUTABLE={python}", f"-Dpybind11_DIR={pybind}"),
            ],
        ),
        ("cmake build", ["cmake", "--build", str(out), "-j", str(os.cpu_count() or 1)]),
        ("cmake install", ["cmake", "--install", str(out), "--prefix", str(tree)]),
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(f"base {tree.name[:12]}: building in {out} (log {log})", flush=True)
    with open(log, "w") as f, locked(BUILD_LOCK):
        for name, cmd in steps:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            try:
                rc = subprocess.run(
                    cmd, stdout=f, stderr=subprocess.STDOUT, timeout=BUILD_STEP_TIMEOUT_S
                ).returncode
            except subprocess.TimeoutExpired:
                raise CompareError(
                    f"building {tree.name[:12]}: {name} took over {BUILD_STEP_TIMEOUT_S:g} s: {log}"
                ) from None
            if rc != 0:
                raise CompareError(f"building {tree.name[:12]} failed ({name}, exit {rc}): {log}")
    print(f"base {tree.name[:12]}: built in {time.monotonic() - t0:.0f} s", flush=True)


# ---- the rounds --------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    name: str  # "head" or "base"
    root: Path
    env: dict[str, str]


def run_once(
    side: Side,
    rel: str,
    args: Sequence[str],
    python: str,
    round_: int,
    logs: Path,
    timeout_s: float,
) -> dict[str, float]:
    logs.mkdir(parents=True, exist_ok=True)
    stem = logs / f"round{round_}-{side.name}"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [python, str(side.root / rel), *args],
            cwd=side.root,
            env=side.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise CompareError(
            f"{side.name} run of {rel} (round {round_}) took over {timeout_s:g} s"
        ) from None
    Path(f"{stem}.out").write_text(proc.stdout)
    Path(f"{stem}.err").write_text(proc.stderr)
    if proc.returncode != 0:
        raise CompareError(
            f"{side.name} run of {rel} (round {round_}) failed with exit {proc.returncode}: "
            f"{_last_line(proc.stderr)} (output in {stem}.err)"
        )
    try:
        got = figures(proc.stdout)
    except ValueError as e:
        raise CompareError(f"{side.name} run of {rel} (round {round_}): {e}") from None
    print(
        f"round {round_} {side.name}: {len(got)} figures in {time.monotonic() - t0:.1f} s",
        flush=True,
    )
    return got


def interleave(
    sides: Sequence[Side],
    rel: str,
    args: Sequence[str],
    python: str,
    rounds: int,
    logs: Path,
    timeout_s: float,
) -> dict[str, list[dict[str, float]]]:
    """``rounds`` rounds, each running every side once in order: each side's figures by round."""
    runs: dict[str, list[dict[str, float]]] = {side.name: [] for side in sides}
    for r in range(1, rounds + 1):
        for side in sides:
            runs[side.name].append(run_once(side, rel, args, python, r, logs, timeout_s))
    return runs


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, str, list[str]]:
    ap = argparse.ArgumentParser(
        prog="scripts/bench_compare.py",
        usage="%(prog)s REV [--rounds N] [--work DIR] [--timeout S] -- BENCH [ARGS...]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("rev", metavar="REV", help="the revision to compare against (any git name)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument(
        "--work",
        default=str(ROOT / "build" / "bench-base"),
        help="where base worktrees and their builds live (default: build/bench-base)",
    )
    ap.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds one benchmark run may take"
    )
    argv = list(argv)
    if "--" not in argv:
        ap.error("the benchmark goes after --: REV [--rounds N] -- BENCH [ARGS...]")
    cut = argv.index("--")
    ns = ap.parse_args(argv[:cut])
    rest = argv[cut + 1 :]
    if not rest:
        ap.error("no benchmark after --")
    if ns.rounds < 1:
        ap.error(f"--rounds must be at least 1, not {ns.rounds}")
    if ns.timeout <= 0:
        ap.error(f"--timeout must be positive, not {ns.timeout:g}")
    return ns, rest[0], rest[1:]


def main(argv: Sequence[str] | None = None) -> int:
    ns, bench, bench_args = parse_args(sys.argv[1:] if argv is None else argv)
    python = sys.executable
    try:
        commit = resolve(ns.rev)
        rel = bench_path(bench)
        check_bench(rel, commit, ns.rev)
        work = Path(ns.work).resolve()
        tree = prepare_base(commit, work, python, work / "logs" / f"{commit}-build.log")
        sides = [Side("base", tree, base_env(tree)), Side("head", ROOT, dict(os.environ))]
        logs = work / "logs" / f"{commit[:12]}-{Path(rel).stem}"
        runs = interleave(sides, rel, bench_args, python, ns.rounds, logs, ns.timeout)
        result = summary(ns.rev, runs["head"], runs["base"])
    except CompareError as e:
        print(f"bench_compare: error: {e}", file=sys.stderr)
        return e.code
    for line in one_sided(runs["head"], runs["base"]):
        print(line)
    if not result["keys"]:
        print(
            f"bench_compare: error: head and base of {rel} print no figure in common",
            file=sys.stderr,
        )
        return 1
    width = max(len(k) for k in result["keys"])
    for k, v in result["keys"].items():
        ratio = "-" if v["ratio"] is None else f"{v['ratio']:.3f}"
        spread = "-" if v["spread"] is None else "{:.3f}-{:.3f}".format(*v["spread"])
        print(
            f"{k:{width}s}  head {v['head']:>14,.4g}  base {v['base']:>14,.4g}  ratio {ratio}"
            f"  rounds {spread}"
        )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
