"""Type stubs for the native module cpu_dist.sparse._ps (see csrc/)."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypedDict, TypeVar

import numpy as np
import numpy.typing as npt

NUM_PARTITIONS: int

_T = TypeVar("_T")

# How rows cross the wire (proto/ps.proto, Compression; csrc/codec.h): "none" (float32),
# "fp16" (a float32 power-of-two scale per row, then IEEE halves of x / scale, ties to even)
# or "int8" (a float32 scale max|x|/127 per row, then int8 values).  Shards keep and update
# float32 rows.
Compression = Literal["none", "fp16", "int8"]

class ClientDefaults(TypedDict):
    max_keys_per_rpc: int
    channels_per_shard: int
    timeout_s: float
    max_message_bytes: int
    compression: Compression

# Bytes as they cross the wire, rows counted encoded (protobuf framing not counted).
class Traffic(TypedDict):
    bytes_pulled: int  # key bytes sent in Pull requests + row bytes (and row_steps/row_states)
    # received in Pull replies
    bytes_pushed: int  # key + gradient bytes sent in Push and Commit requests
    keys_pulled: int
    keys_pushed: int
    retries: int  # pulls and commit chunks sent again after UNAVAILABLE (at most 3 per RPC)

def client_defaults() -> ClientDefaults:
    """Client's keyword defaults, from their one definition (C++ ClientOptions)."""

def encode_rows(rows: npt.ArrayLike, compression: Compression) -> npt.NDArray[np.uint8]:
    """float32 rows [n, dim] as the wire carries them: uint8 [n, bytes per row] (4 dim, 4 + 2 dim
    or 4 + dim).  ValueError naming the row and column of a value the encoding cannot carry
    (non-finite; |x| >= 2^127 in fp16)."""

def decode_rows(data: npt.ArrayLike, dim: int, compression: Compression) -> npt.NDArray[np.float32]:
    """The float32 rows that encoded rows stand for: what a shard applies for a compressed
    gradient and what a compressed pull returns.  decode_rows(encode_rows(x, c), dim, c) is
    the round trip a compressed job's rows and gradients go through."""

def mark_written(keys: npt.ArrayLike, written: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Bool per key: whether it is in ``written`` (int64, sorted ascending, distinct; ValueError
    naming the first position out of order otherwise).  One merge pass where ``keys`` are
    sorted (a step's unique keys), a search per key otherwise: the early read's rule 1."""

def interleave_rows(
    written: npt.ArrayLike, late: npt.ArrayLike, early: npt.ArrayLike
) -> npt.NDArray[np.float32]:
    """float32 ``[n, dim]``: row i the next row of ``late`` where ``written[i]``, of ``early``
    otherwise (ValueError unless they hold exactly those rows, of one width)."""

def fill_rows(
    keys: npt.ArrayLike,
    rest: npt.ArrayLike,
    held: list[tuple[npt.ArrayLike, npt.ArrayLike]],
) -> npt.NDArray[np.float32]:
    """float32 ``[n, dim]``: row i the row of ``keys[i]`` in the first ``(keys, rows)`` level
    of ``held`` that holds it, else the next row of ``rest`` (in key order).  One merge pass
    per level; every key array sorted ascending and distinct (a step's unique keys), and
    ``rest`` exactly the rows of the keys no level holds (ValueError naming what is off)."""

class PSError(RuntimeError):
    """A failed RPC: str() is "shard I (ADDR): CODE: message".

    The same as fields, so that no caller parses the text: ``shard`` (the shard's index),
    ``address`` (its host:port) and ``code`` (the gRPC status code's name, e.g.
    ``"UNAVAILABLE"``); each None where a failure has none (a malformed reply has no code).
    ``PSError(message)`` builds one from Python with every field None."""

    shard: int | None
    address: str | None
    code: str | None
    def __init__(
        self,
        message: str,
        shard: int | None = None,
        address: str | None = None,
        code: str | None = None,
    ) -> None: ...

def partition_of(keys: npt.ArrayLike) -> npt.NDArray[np.int64]: ...
def row_init(seed: int, keys: npt.ArrayLike, dim: int, scale: float) -> npt.NDArray[np.float32]: ...
def apply_rows(
    rows: npt.NDArray[np.float32],
    sums: npt.ArrayLike,
    lr: float,
    optimizer: str,
    divisor: float = 1.0,
    states: npt.NDArray[np.float32] | None = None,
    eps: float = 1e-8,
) -> None:
    """In place: rows (float32 [n, dim], C order) and states (row-wise Adagrad's float32 [n],
    Adagrad's float32 [n, dim]; ``eps`` is Adagrad's) as a commit changes them on a shard, given
    the step's summed gradient rows and its world size as divisor: the shard's arithmetic
    (csrc/row_update.h), so the bits agree.  TypeError
    unless rows and states are writeable C-contiguous float32 numpy arrays (a converted copy
    would be updated instead)."""

class Server:
    def __init__(
        self,
        dim: int,
        token: str,
        *,
        init_scale: float | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        table: str = "embedding",
        seed: int = 0,
        shard_index: int = 0,
        num_shards: int = 1,
        max_message_bytes: int = 64 << 20,
        max_blocks_per_stripe: int = 65536,
        checkpoint_dir: str = "",
        session_idle_timeout_s: float = 0.0,
        max_sessions: int = 1024,
        max_held_bytes: int = 1 << 30,
        max_pending_bytes: int = 1 << 30,
        max_memory_bytes: int = 4 << 30,
        max_concurrent_streams: int = 256,
        memory_rows: int = 0,
        memory_bytes: int = 0,
        ssd_dir: str = "",
        admit_after: int = 0,
        expire_after: int = 0,
        tables: list[dict[str, Any]] | None = None,
        test_hooks: bool = False,
    ) -> None:
        """One shard.  ``token``: printable ASCII without spaces (it travels as call
        metadata).  ``session_idle_timeout_s``: commit sessions without a chunk, wait or close
        for this long are ended (0: never).  ``max_sessions``: live sessions; a new one
        evicts the least recently active.  ``max_held_bytes``: per session, the chunks held
        for steps after the next one; ``max_pending_bytes``: the next step's (a chunk beyond
        fails the session, RESOURCE_EXHAUSTED).  ``max_memory_bytes``: gRPC's memory quota for
        the server, and apart from it the bound on gradients being decoded from compressed
        requests at once; ``max_concurrent_streams``: per connection.  ``memory_rows``: rows
        the DRAM tier holds (0: unbounded); without ``ssd_dir`` an update needing more is refused
        (RESOURCE_EXHAUSTED), with it (an absolute directory; the shard makes its own RocksDB
        in it and removes it when it stops) the rows beyond go to SSD.  ``admit_after`` N (0,
        1: off) and ``expire_after`` S (0: off): the step rules of commits (csrc/table_rules.h).
        ``tables``: the shard's tables as spec dicts (``name``, ``dim``, ``optimizer``,
        ``init_scale``, ``seed``, ``num_embeddings``, ``admit_after``, ``expire_after``, ``eps``:
        ``cpu_dist/common/tables.py`` ``TableConfig.spec``), then ``dim`` must be 0; without
        them ``dim > 0`` declares the one table ``table`` (with ``seed``, ``init_scale``,
        required then, and the rules above) whose optimizer each request names; neither: no
        table until ``Client.create_tables``.  ``memory_bytes``: the DRAM budget in bytes of
        every table together (needs ``ssd_dir``).
        ``test_hooks``: test-only pause points (``test_hold``); never set outside tests.
        ValueError on bad values."""
    def start(self) -> int:
        """Bind and serve; returns the bound port.  RuntimeError naming host:port when it
        cannot listen ("address already in use": one port serves one shard)."""
    # Test-only (csrc/test_hooks.h), on a server made with test_hooks=True (else
    # RuntimeError); points: "pull_between_stripes" (a pull's gather after its first stripe),
    # "save_frozen" (a Save with the table frozen), "decode_reserved" (a compressed request,
    # its decoded bytes counted, before decoding), "step_locked" (a committed step's apply,
    # its tables' step locks taken, no row changed), "retry_deferred" (a Push or Commit that
    # met a lock, on the thread that may wait, before it runs again).  A thread holds at most
    # 60 s.
    def test_hold(self, point: str) -> None:
        """The next thread that reaches ``point`` holds there until test_release."""
    def test_wait_held(self, point: str, timeout_s: float = 10.0) -> bool:
        """True once a thread holds at ``point`` (within timeout_s)."""
    def test_release(self, point: str) -> None:
        """The thread held at ``point`` goes on."""
    def test_fail_ssd_writes(self, on: bool) -> None:
        """While on, every write to the SSD tier fails (TierError)."""
    @property
    def port(self) -> int: ...
    @property
    def address(self) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def table(self) -> str: ...
    def wait(self, timeout_s: float | None = None) -> bool:
        """True once stopped.  None waits forever; NaN is a ValueError; negatives don't
        wait; huge values are capped (1e9 s).  RuntimeError before start()."""
    def stop(self, drain_timeout_s: float = 10.0) -> None: ...
    def stats(self) -> dict[str, int]: ...

# (keys int64 [n] sorted, values float32 [n, dim], state float32 [n], or [n, dim] for an
# element-wise Adagrad table).
_Rows = tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32]]

class TableSpec(TypedDict, total=False):
    """A table as shards hold it (the one spec dict shape of cpu_dist; proto TableSpec).
    name, dim, optimizer and init_scale are required (by Server(tables=...) and
    create_tables alike); seed, num_embeddings, admit_after and expire_after default to 0,
    eps to 1e-8 for "adagrad" (it is 0.0 for the others)."""

    name: str
    dim: int
    optimizer: Literal["sgd", "rowwise_adagrad", "adagrad"]
    init_scale: float
    seed: int
    num_embeddings: int
    admit_after: int
    expire_after: int
    eps: float

class TableStats(TypedDict):
    """One table's figures in a shard's stats()["tables"]."""

    name: str
    dim: int
    rows: int
    rows_dram: int
    rows_ssd: int
    ssd_bytes: int
    rows_admitted: int
    rows_expired: int
    bytes: int
    blocks_ahead: int

class DumpPages:
    """Pages of a dump, (keys, values, state) each: keys sorted inside a page, every page from
    one shard, pages in no global order; at most one page per shard is held at a time."""

    def __iter__(self) -> DumpPages: ...
    def __next__(self) -> _Rows: ...

class Handle(Generic[_T]):
    """An asynchronous pull, push or commit in flight (not generic at run time).  Dropping
    it is safe: the client keeps the operation until its last RPC finished."""

    def wait(self, timeout_s: float | None = None) -> _T:
        """Wait until done: None for a push or commit, the rows (float32 [n, dim], a new
        array) for a pull.  PSError on failure, TimeoutError on timeout; None waits forever."""
    def done(self) -> bool: ...
    def committed_step(self) -> int | None:
        """Of a finished pull that named a session: the minimum committed step of the shards
        it touched (-1: none of them has one yet); None otherwise."""
    def row_steps(self) -> npt.NDArray[np.int64] | None:
        """Of a finished pull with row_steps: per row, the session step up to which the row
        holds every commit of the session that touched it, and none after (int64 min where the
        shard gave no bound); None otherwise."""
    def row_states(self) -> npt.NDArray[np.float32] | None:
        """Of a finished pull with row_states: the rows' optimizer states, float32 [n] (sgd,
        row-wise Adagrad) or [n, dim] (Adagrad); None otherwise."""

class TablesHandle:
    """A multi-table pull in flight (Client.pull_tables_async): Handle's methods, each
    giving {table: what Handle's gives} for every table of the pull."""

    def wait(self, timeout_s: float | None = None) -> dict[str, npt.NDArray[np.float32]]:
        """As Handle.wait: {table: float32 rows [n, dim of that table]} (new arrays)."""
    def done(self) -> bool: ...
    def committed_step(self) -> int | None:
        """As Handle.committed_step, over every table's shards."""
    def row_steps(self) -> dict[str, npt.NDArray[np.int64]] | None:
        """As Handle.row_steps: {table: int64 per row}."""
    def row_states(self) -> dict[str, npt.NDArray[np.float32]] | None:
        """As Handle.row_states: {table: float32 [n] (sgd: zeros, row-wise Adagrad) or
        [n, dim] (Adagrad)}."""

# A push's or commit's share of one table: (keys [n], grads float32 [n, dim of the table], lr).
_TableUpdate = tuple[npt.ArrayLike, npt.ArrayLike, float]

class Client:
    def __init__(
        self,
        addresses: list[str],
        token: str,
        dim: int = 0,
        *,
        table: str = "embedding",
        tables: list[tuple[str, int]] | None = None,
        max_keys_per_rpc: int = 8192,
        channels_per_shard: int = 2,
        timeout_s: float = 60.0,
        max_message_bytes: int = 64 << 20,
        compression: Compression = "none",
    ) -> None:
        """A client of the shards at ``addresses``.

        Args:
            dim, table: the table of the one-table calls (pull, push, commit, dump, save,
                load).  With ``tables``: ``table`` where it names one of them (else the
                first), and ``dim`` 0 or that table's dim.
            tables: (name, dim) of every table the multi-table calls (pull_tables,
                push_tables, commit_tables) move, in the order they cross the wire; None:
                the one table (table, dim).  Names unique, dims >= 1 (ValueError otherwise).
            compression: the job's encoding of pulled rows (unless a pull names another)
                and of pushed and committed gradients; dumps and checkpoints are never
                compressed.
            max_keys_per_rpc: keys per RPC, all tables of a call together; sized for
                float32 rows of the widest table whatever the compression."""
    def close(self) -> None:
        """Wait for in-flight async operations and release the client; idempotent."""
    @property
    def num_shards(self) -> int: ...
    @property
    def addresses(self) -> list[str]: ...
    @property
    def dim(self) -> int: ...
    @property
    def table(self) -> str:
        """The one-table calls' table."""
    @property
    def tables(self) -> list[tuple[str, int]]:
        """(name, dim) of every table of the multi-table calls, in wire order."""
    @property
    def compression(self) -> Compression: ...
    # Pulls: compression None is the client's ("none" for evaluation pulls of a compressed
    # job).  With `session`, each shard reports that commit session's committed step, read
    # before it gathered the rows (they hold at least every step up to it).
    def pull(
        self,
        keys: npt.ArrayLike,
        out: npt.NDArray[np.float32] | None = None,
        *,
        compression: Compression | None = None,
        session: int | None = None,
    ) -> npt.NDArray[np.float32]: ...
    def pull_async(
        self,
        keys: npt.ArrayLike,
        *,
        compression: Compression | None = None,
        session: int | None = None,
        row_steps: bool = False,
        row_states: bool = False,
        after_step: int | None = None,
        wait_timeout: float | None = None,
    ) -> Handle[npt.NDArray[np.float32]]:
        """Like pull, at once; wait() returns the rows, committed_step() what the shards
        reported for `session`; with row_steps and row_states (they need `session`),
        row_steps() and row_states() what each row holds.  With after_step (it needs
        `session` and wait_timeout seconds), every shard answers once that session step is
        committed on it, with the rows as they are then (committed_step() >= after_step):
        a read that depends on a commit in one round trip, started before it is applied."""
    def last_pull_committed(self) -> int | None:
        """Of the last blocking pull that named a session (any thread): the minimum committed
        step of the shards it touched (-1: none has one); None before one or when it touched
        no shard.  Concurrent pullers use pull_async and Handle.committed_step()."""
    # Push is a direct update, for benchmarks, tests and bulk loading of large tables;
    # training uses commit (aggregated over ranks, ordered by step).  The blocking forms
    # are the asynchronous ones followed by Handle.wait().
    def push(
        self, keys: npt.ArrayLike, grads: npt.ArrayLike, lr: float, optimizer: str = "sgd"
    ) -> None: ...
    def push_async(
        self, keys: npt.ArrayLike, grads: npt.ArrayLike, lr: float, optimizer: str = "sgd"
    ) -> Handle[None]: ...
    # A shard accepts a commit's chunks for a step up to max_ahead (1..64) beyond its
    # committed one and holds them; steps still apply in order.  Gradients must be finite in
    # float32 (and below 2^127 in magnitude with fp16 compression) and lr finite and > 0
    # (ValueError naming the key or the lr; nothing is sent).  base_step: the job step of the
    # session's step 0 (constant per session; the shards' admission and expiry rules count
    # job steps base_step + step).  Pushes and commits send their gradients encoded as the
    # client's compression; the shard decodes them to float32 before anything else.
    def commit(
        self,
        session: int,
        step: int,
        rank: int,
        world_size: int,
        keys: npt.ArrayLike,
        grads: npt.ArrayLike,
        lr: float,
        optimizer: str = "sgd",
        *,
        max_ahead: int = 1,
        base_step: int = 0,
    ) -> None: ...
    def commit_async(
        self,
        session: int,
        step: int,
        rank: int,
        world_size: int,
        keys: npt.ArrayLike,
        grads: npt.ArrayLike,
        lr: float,
        optimizer: str = "sgd",
        *,
        max_ahead: int = 1,
        base_step: int = 0,
    ) -> Handle[None]: ...
    # ---- many tables in one call (proto TablePart) ----
    # Per shard, a call's tables' keys lie end to end and are cut into RPCs of at most
    # max_keys_per_rpc keys: one RPC per shard per max_keys_per_rpc keys whatever the number
    # of tables.  Each table's keys go to shards by its salted shard_of (contracts.shard_of
    # with table=).  A table not among the client's `tables` is a ValueError naming it; a
    # shard that lacks it, or holds it with another dim, refuses (PSError naming the table).
    def create_tables(self, specs: list[TableSpec]) -> list[dict[str, int]]:
        """Create tables on every shard.

        Args:
            specs: spec dicts (TableSpec); an unknown key or a bad value is a ValueError
                naming the table and the key.

        Returns:
            Per shard {"created": n, "existing": m}: idempotent for an identical spec; a
            shard holding the table with another spec refuses (PSError naming the table and
            the field)."""
    def pull_tables(
        self,
        parts: dict[str, npt.ArrayLike],
        *,
        compression: Compression | None = None,
        session: int | None = None,
    ) -> dict[str, npt.NDArray[np.float32]]:
        """Rows of several tables in one round of RPCs.

        Args:
            parts: {table: keys (1-D int64)}; repeated keys are pulled once.
            compression: the replies' encoding (None: the client's), per request.
            session: a commit session whose committed step each shard reports (see
                pull_tables_async).

        Returns:
            {table: float32 rows [n, dim of that table]} (absent rows: their first-touch
            values, contracts.row_init with the table's seed and salt)."""
    def pull_tables_async(
        self,
        parts: dict[str, npt.ArrayLike],
        *,
        compression: Compression | None = None,
        session: int | None = None,
        row_steps: bool = False,
        row_states: bool = False,
        after_step: int | None = None,
        wait_timeout: float | None = None,
    ) -> TablesHandle:
        """Like pull_tables, at once.

        Args:
            parts, compression, session: as pull_tables.
            row_steps, row_states: (need ``session``) the handle's row_steps() and
                row_states() give each table's per-row steps and optimizer states (float32
                [n], or [n, dim] for Adagrad tables: the client asks the shards' Health for
                the tables' optimizers once, unless create_tables told it).
            after_step, wait_timeout: as pull_async's (every shard answers once that step
                of ``session`` is committed on it).

        Returns:
            A TablesHandle; its wait() returns what pull_tables does."""
    def push_tables(self, parts: dict[str, _TableUpdate], *, optimizer: str | None = None) -> None:
        """A direct update of several tables (benchmarks, tests).

        Args:
            parts: {table: (keys, grads float32 [n, dim of the table], lr)}; per table,
                repeated keys are summed, then the table's optimizer runs once per row.
            optimizer: None: each table's spec's.  A name: what a table declared by a
                shard's flags (the one table of a job without a job file) runs; a table
                created with a spec refuses any other than its own."""
    def push_tables_async(
        self, parts: dict[str, _TableUpdate], *, optimizer: str | None = None
    ) -> Handle[None]: ...
    def commit_tables(
        self,
        session: int,
        step: int,
        rank: int,
        world_size: int,
        parts: dict[str, _TableUpdate],
        *,
        max_ahead: int = 1,
        base_step: int = 0,
        optimizer: str | None = None,
    ) -> None:
        """This rank's gradients of one step of a commit session, every table of the step.

        Args:
            session, step, rank, world_size, max_ahead, base_step: as commit.
            parts: {table: (keys, grads float32 [n, dim of the table], lr)}, tables without
                keys too (they are named in every chunk: the step covers them).
            optimizer: as push_tables' (None: each table's spec's).

        Every shard gets at least one chunk of every step (an empty marker where it has no
        rows); a shard applies the step's rows of every table at once, when every rank's
        chunks arrived.  Gradients are checked as commit's are (ValueError naming the table
        and the key; nothing is sent)."""
    def commit_tables_async(
        self,
        session: int,
        step: int,
        rank: int,
        world_size: int,
        parts: dict[str, _TableUpdate],
        *,
        max_ahead: int = 1,
        base_step: int = 0,
        optimizer: str | None = None,
    ) -> Handle[None]: ...
    def wait_committed(self, session: int, step: int, timeout_s: float) -> int: ...
    def committed_step(self, session: int) -> int: ...
    def close_session(self, session: int, rank: int) -> None: ...
    def abort_sessions(self) -> list[dict[str, int]]:
        """End every open commit session on every shard (chunks dropped, waiters failed with
        ABORTED, later chunks refused): a job that takes the shards over calls this before
        load().  One {"aborted": n} per shard."""
    def stats(self) -> list[dict[str, Any]]:
        """Per shard: the totals (rows, calls, bytes, tiers...) and "tables": a TableStats
        per table, name order."""
    def health(self) -> list[dict[str, Any]]:
        """Per shard: serving, shard_index, num_shards, dim, table (str), seed, init_scale
        (the shard's float32 as a Python float), rows, and "tables": the spec dict
        (TableSpec, every key) of every table it holds, name order."""
    def traffic(self) -> Traffic:
        """Payload bytes and keys this client moved in successful RPCs, rows counted as
        encoded on the wire (protobuf framing not counted)."""
    def shutdown(self) -> None: ...
    def dump(self, *, table: str | None = None, max_bytes: int | None = None) -> _Rows:
        """Every row of one table on every shard, sorted by key.

        Args:
            table: one of the client's tables (None: the one-table calls' table).
            max_bytes: page size (None: the default, 4 MiB); pages come from the shards in
                parallel; no size limit."""
    def dump_pages(self, *, table: str | None = None, max_bytes: int | None = None) -> DumpPages:
        """The pages of dump(table=...) one at a time (at most one page per shard held)."""
    # Checkpoints; paths are relative to each shard's checkpoint_dir (see checkpoint.h).
    # timeout_s None: the client's timeout_s; a job passes its --checkpoint-timeout.
    def save(
        self,
        paths: list[str],
        step: int,
        session: int | None = None,
        session_step: int = -1,
        timeout_s: float | None = None,
    ) -> list[dict[str, int]]: ...
    def load(
        self,
        paths: list[str],
        sizes: list[int] = ...,
        checksums: list[int] = ...,
        timeout_s: float | None = None,
    ) -> list[dict[str, int]]: ...
