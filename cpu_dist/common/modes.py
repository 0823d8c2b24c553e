"""The sparse modes as data: one table (:data:`MODES`) that says, for each way a worker reads a
step's rows and hands off its gradients, which settings choose it, which it refuses (and in
what words), and where its shards may live.  Everything that knows a mode reads this table:
``cpu_dist.train.pipelines.choose.sparse_mode`` picks the first row whose requirements hold,
``validate`` and ``job_file_checks`` stop a chosen mode's refused settings, ``flag_warnings``
names the flags that change nothing in the chosen mode, and the README's table of modes is
:func:`render` of it (``python -m cpu_dist.common.modes --update README.md`` writes it between
the ``<!-- modes:begin -->`` / ``<!-- modes:end -->`` markers; a test holds them equal).

The rules read :class:`Facts`, one small vocabulary that both the flags (an argparse
Namespace, before a Config exists) and a Config are read into, so that the two cannot
disagree.  It lives in ``common`` (the bottom layer) because validation must read it; the
pipeline classes each strategy names are mapped in ``train/pipelines/choose.py``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from cpu_dist.common.config import Config

Strategy = Literal["cache", "catch_up", "sole_writer", "early_pull", "async_prefetch", "direct"]
# Where a job's shards live: PS ranks of the job, or shards started elsewhere (``--ps_list``
# and no PS ranks).  The second axis of the table: a shard in the worker's own process is the
# next value (each row then says whether it runs there).
ShardPlace = Literal["ps_rank", "external"]
SHARD_PLACES: dict[str, str] = {
    "ps_rank": "a PS rank",
    "external": "another host (`--ps_list`, no PS ranks)",
}


@dataclass(frozen=True)
class Facts:
    """What the choice of a mode depends on, each fact one of a few words (:data:`FACTS`)."""

    read_mode: str = "direct"  # --read-mode
    sparse_sync: str = "pipelined"  # --sparse-sync
    aggregation: str = "ps"  # --aggregation
    staleness: str = ">0"  # --max-staleness: "0" or ">0"
    workers: str = ">1"  # --worker-num: "1" or ">1"
    compression: str = "none"  # --ps-compression
    optimizer: str = "sgd"  # every table's optimizer: "sgd", else "adaptive"
    rules: str = "none"  # table rules: "none", "admit" (admission only) or "expire"
    shard: str = "ps_rank"  # ShardPlace


# fact -> (its name in the README's table, the values it takes, what gives it where the name
# does not say)
FACTS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "read_mode": ("`--read-mode`", ("direct", "bagpipe"), ""),
    "sparse_sync": ("`--sparse-sync`", ("pipelined", "barrier", "async"), ""),
    "aggregation": ("`--aggregation`", ("ps", "collective"), ""),
    "staleness": ("`--max-staleness`", ("0", ">0"), ""),
    "workers": ("`--worker-num`", ("1", ">1"), ""),
    "compression": ("`--ps-compression`", ("none", "fp16", "int8"), ""),
    "optimizer": (
        "optimizer",
        ("sgd", "adaptive"),
        "every table's (`--sparse-optimizer`, `[[tables]] optimizer`)",
    ),
    "rules": (
        "rules",
        ("none", "admit", "expire"),
        "the tables' admission and expiry (`--ps-admit-after`, `--ps-expire-after`, "
        "`[[tables]] admit_after` / `expire_after`)",
    ),
    "shard": ("shards", tuple(SHARD_PLACES), "where the shards live"),
}


@dataclass(frozen=True)
class Require:
    """A row is chosen only where ``fact`` is one of ``values``."""

    fact: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Refusal:
    """A setting a chosen mode cannot run with: ``fact`` outside ``allowed`` stops the job
    (exit 2) with ``message`` (``str.format`` fields: the flags' Namespace attributes) or, for
    one table of a job file, ``table_message`` (fields ``where`` and ``optimizer``; empty: the
    fact is not a table's)."""

    fact: str
    allowed: tuple[str, ...]
    message: str
    table_message: str = ""


@dataclass(frozen=True)
class Flag:
    """A flag that only takes effect where ``fact`` is one of ``values``: given elsewhere it
    gets the warning ``{flag} has no effect without {needs}``."""

    dest: str
    fact: str
    values: tuple[str, ...]
    needs: str

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


@dataclass(frozen=True)
class Mode:
    """One way of reading rows: chosen where every requirement holds (the first such row of
    :data:`MODES`); ``refuses`` only matter for a mode a flag chooses outright (the cache),
    the others give way to the next row instead."""

    strategy: Strategy
    does: str  # what it does, for the README's table
    requires: tuple[Require, ...] = ()
    refuses: tuple[Refusal, ...] = ()
    # The aggregation learns the rows each step writes (an allgather of ids) for early pulls.
    exchange_ids: bool = False
    # Hand-offs on a thread of their own: the cache and the catch-up keep their rows coherent
    # themselves, so the hand-off may overlap the dense phase.
    background: bool = False
    shards: tuple[str, ...] = ("ps_rank", "external")


NO_RULES = Require("rules", ("none",))
CACHE_RULES = "the cache's coherence rules assume every gradient is applied to the PS rows"

# In order: the first row whose requirements hold is the job's mode.
MODES: tuple[Mode, ...] = (
    Mode(
        "cache",
        "a bounded row cache of each table in front of the PS (`gpu_cache`), kept coherent "
        "with it by applying each step's SGD update to the cached rows the worker can know",
        requires=(Require("read_mode", ("bagpipe",)),),
        refuses=(
            Refusal(
                "rules",
                ("none",),
                "--read-mode bagpipe does not support --ps-admit-after or --ps-expire-after: "
                + CACHE_RULES,
                "{where}: admit_after / expire_after: "
                + CACHE_RULES
                + "; drop the table's rules or --read-mode bagpipe",
            ),
            Refusal(
                "compression",
                ("none",),
                "--read-mode bagpipe does not support --ps-compression {ps_compression}: the "
                "cache keeps exact copies of the PS rows, which compressed pulls and gradients "
                "are not",
            ),
            Refusal(
                "sparse_sync",
                ("pipelined", "barrier"),
                "--read-mode bagpipe needs a synchronous --sparse-sync (pipelined or barrier): "
                "the cache keeps its rows equal to the PS rows by applying each step's update "
                "in order, which asynchronous commits do not give it",
            ),
            Refusal(
                "optimizer",
                ("sgd",),
                "--read-mode bagpipe supports --sparse-optimizer sgd only, not "
                "{sparse_optimizer}: the cache cannot mirror an adaptive optimizer's PS-side "
                "state",
                "{where}: optimizer {optimizer!r}: the cache supports 'sgd' only (it cannot "
                "mirror an adaptive optimizer's PS-side state); give the table optimizer = "
                "'sgd' or drop --read-mode bagpipe",
            ),
        ),
        background=True,
    ),
    Mode(
        "catch_up",
        "the next step's rows are pulled during the whole step and the worker applies the "
        "commits they miss from the summed gradients it holds: reads wait for no commit, the "
        "model equals `barrier`'s bit for bit (also under `async`: staleness 0)",
        requires=(
            Require("sparse_sync", ("pipelined", "async")),
            Require("aggregation", ("collective",)),
            NO_RULES,
        ),
        background=True,
    ),
    Mode(
        "sole_writer",
        "every commit is this worker's own SGD step: it applies it to the rows it read (the "
        "shard's arithmetic) and pulls the rest during the step before",
        requires=(
            Require("workers", ("1",)),
            Require("sparse_sync", ("pipelined",)),
            Require("aggregation", ("ps",)),
            NO_RULES,
            Require("compression", ("none",)),
            Require("optimizer", ("sgd",)),
        ),
        background=True,
    ),
    Mode(
        "early_pull",
        "the next step's rows this step does not write are pulled during the dense phase; "
        "the written ones after the commit",
        # expiry can drop a row at its commit: a write of that step no worker knows of
        requires=(Require("sparse_sync", ("pipelined",)), Require("rules", ("none", "admit"))),
        exchange_ids=True,
    ),
    Mode(
        "async_prefetch",
        "the same early pull; a read of step t waits only for commit t-1-K, and the shards' "
        "replies say whether they hold every commit the bound needs",
        requires=(Require("sparse_sync", ("async",)), Require("staleness", (">0",))),
        exchange_ids=True,
    ),
    Mode(
        "direct",
        "waits for the commit its read depends on (t-1, or t-1-K under `async`), then pulls "
        "every row",
    ),
)

# Flags that change something only in some modes (a warning elsewhere, ``flag_warnings``).
MODE_FLAGS: tuple[Flag, ...] = (
    Flag("max_staleness", "sparse_sync", ("async",), "--sparse-sync async"),
    Flag("optimization_cache_capacity", "read_mode", ("bagpipe",), "--read-mode bagpipe"),
    Flag("optimization_bypass_below", "read_mode", ("bagpipe",), "--read-mode bagpipe"),
)
# Job-file table keys that change something only in some modes: (key, fact, values, needs).
MODE_TABLE_KEYS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("cache_capacity", "read_mode", ("bagpipe",), "--read-mode bagpipe"),
)


class _Table(Protocol):
    """What a fact reads of one embedding table (``cpu_dist.common.tables.TableConfig``)."""

    @property
    def optimizer(self) -> str: ...
    @property
    def admit_after(self) -> int: ...
    @property
    def expire_after(self) -> int: ...


def _rules(admit: bool, expire: bool) -> str:
    return "expire" if expire else "admit" if admit else "none"


def facts_of_config(cfg: Config) -> Facts:
    """A validated job's facts, as the mode is chosen from them.  ``--ps-admit-after 1`` (off,
    as 0 is) counts as a rule here, as it always has for the choice (it keeps a job off the
    catch-up and the sole writer)."""
    t, tables = cfg.train, cfg.tables.tables
    expire = bool(cfg.storage.expire_after) or any(x.expire_after for x in tables)
    admit = bool(cfg.storage.admit_after) or any(x.admit_after > 1 for x in tables)
    return Facts(
        read_mode="bagpipe" if cfg.cache is not None else "direct",
        sparse_sync=t.sparse_sync,
        aggregation=t.aggregation,
        staleness=">0" if t.max_staleness > 0 else "0",
        workers="1" if cfg.job.worker_num == 1 else ">1",
        compression=cfg.client.compression,
        optimizer="sgd" if all(x.optimizer == "sgd" for x in tables) else "adaptive",
        rules=_rules(admit, expire),
        shard="external" if cfg.job.external_shards else "ps_rank",
    )


def facts_of_flags(
    a: argparse.Namespace, worker_num: int, external: bool, tables: Sequence[_Table] = ()
) -> Facts:
    """The flags' facts, before a Config exists (``validate``).  A job file's ``tables`` give
    the optimizer (``--sparse-optimizer`` is only their default); the rules are the flags'
    (a table's own are checked per table, :func:`table_refusal`)."""
    optimizers = [t.optimizer for t in tables] or [a.sparse_optimizer]
    return Facts(
        read_mode=a.read_mode,
        sparse_sync=a.sparse_sync,
        aggregation=a.aggregation,
        staleness=">0" if a.max_staleness > 0 else "0",
        workers="1" if worker_num == 1 else ">1",
        compression=a.ps_compression,
        optimizer="sgd" if all(o == "sgd" for o in optimizers) else "adaptive",
        rules=_rules(a.ps_admit_after > 1, a.ps_expire_after > 0),
        shard="external" if external else "ps_rank",
    )


def _holds(facts: Facts, fact: str, values: Iterable[str]) -> bool:
    return getattr(facts, fact) in values


def choose(facts: Facts) -> Mode:
    """The first row of :data:`MODES` whose requirements hold and whose shards may live where
    these do (``direct``, the last, requires nothing)."""
    for mode in MODES:
        if facts.shard in mode.shards and all(
            _holds(facts, r.fact, r.values) for r in mode.requires
        ):
            return mode
    raise LookupError(f"no sparse mode for {facts}")  # the table's last row requires nothing


def mode_named(strategy: str) -> Mode:
    return next(m for m in MODES if m.strategy == strategy)


def refusal(strategy: str, facts: Facts, fields: dict[str, object]) -> str | None:
    """The first refusal of the named mode's row that these facts meet (formatted with
    ``fields``, the flags' values), or None."""
    mode = mode_named(strategy)
    if facts.shard not in mode.shards:
        return f"--read-mode {facts.read_mode}: not with {SHARD_PLACES[facts.shard]}"
    for r in mode.refuses:
        if not _holds(facts, r.fact, r.allowed):
            return r.message.format(**fields)
    return None


def table_refusal(strategy: str, table: _Table, where: str) -> str | None:
    """The first refusal of the named mode's row that one job-file table meets (its
    optimizer, its rules), or None."""
    facts = Facts(
        optimizer="sgd" if table.optimizer == "sgd" else "adaptive",
        rules=_rules(table.admit_after > 1, table.expire_after > 0),
    )
    for r in mode_named(strategy).refuses:
        if r.table_message and not _holds(facts, r.fact, r.allowed):
            return r.table_message.format(where=where, optimizer=table.optimizer)
    return None


def ineffective(given: Iterable[str], facts: Facts) -> list[str]:
    """Warnings for given flags (dests) that change nothing in the mode these facts choose."""
    given = set(given)
    return [
        f"{f.flag} has no effect without {f.needs}"
        for f in MODE_FLAGS
        if f.dest in given and not _holds(facts, f.fact, f.values)
    ]


def _words(fact: str, values: Sequence[str]) -> str:
    return f"{FACTS[fact][0]} {' or '.join(values)}"


def render(modes: Sequence[Mode] = ()) -> str:
    """The README's table of modes (markdown): one row per mode in choosing order, then what
    the short names stand for."""
    rows = [
        "| mode | chosen when (the first row that holds) | what it does | refuses (exit 2) | "
        "shards |",
        "|---|---|---|---|---|",
    ]
    for m in modes or MODES:
        when = "; ".join(_words(r.fact, r.values) for r in m.requires) or "otherwise"
        refused = "; ".join(
            _words(r.fact, [v for v in FACTS[r.fact][1] if v not in r.allowed]) for r in m.refuses
        )
        shards = ", ".join(SHARD_PLACES[s] for s in m.shards)
        rows.append(f"| `{m.strategy}` | {when} | {m.does} | {refused or '-'} | {shards} |")
    legend = "; ".join(f"{name}: {says}" for name, _, says in FACTS.values() if says)
    flags = ", ".join(f"`{f.flag}` (`{f.needs}`)" for f in MODE_FLAGS)
    notes = [
        f"Names: {legend}.",
        f"Flags that act in some modes only (a warning elsewhere): {flags}.",
    ]
    return "\n".join(rows) + "\n\n" + "\n\n".join(notes) + "\n"


BEGIN, END = "<!-- modes:begin -->", "<!-- modes:end -->"


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the markers replaced by ``block``."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ValueError(f"no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def block_of(text: str) -> str:
    """What lies between the markers (the rendered table, as :func:`replace_block` writes)."""
    inner = text.partition(BEGIN)[2].partition(END)[0]
    return inner[1:] if inner.startswith("\n") else inner


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m cpu_dist.common.modes", description="print or write the table of modes"
    )
    p.add_argument("--markdown", action="store_true", help="print the table (the default)")
    p.add_argument("--update", metavar="FILE", help="rewrite FILE's modes block in place")
    a = p.parse_args(argv)
    if a.update:
        path = Path(a.update)
        try:
            path.write_text(replace_block(path.read_text(), render()))
        except (OSError, ValueError) as exc:
            print(f"{p.prog}: error: {a.update}: {exc}", file=sys.stderr)
            return 2
        return 0
    sys.stdout.write(render())
    return 0


__all__ = [
    "FACTS",
    "MODES",
    "MODE_FLAGS",
    "Facts",
    "Flag",
    "Mode",
    "Refusal",
    "Require",
    "Strategy",
    "choose",
    "facts_of_config",
    "facts_of_flags",
    "ineffective",
    "refusal",
    "render",
    "table_refusal",
]

if __name__ == "__main__":
    raise SystemExit(main())
