// Ordered commit sessions: every rank sends its sparse gradients of step t in chunks; the
// shard applies step t only when all ranks' chunks are in, summing per key in rank order
// then chunk order (so the bits depend neither on arrival order nor on chunking), dividing
// by world_size and running the optimizer once per row.  Steps apply strictly in order; a
// chunk may come up to max_ahead steps beyond the committed one, and such early steps are
// held (bounded per session) until their turn.  Everything is validated on arrival so that
// applying a step cannot fail half way.
//
// Sessions end when their ranks close them, when they idle past the shard's timeout, when
// the live-session cap makes room (least recently active first), or when a job that takes
// the shard over aborts them all; an ended session's id is remembered so that it is never
// created again by a late chunk.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "commit_limits.h"
#include "grpcpp/support/status.h"
#include "optimizer.h"
#include "table.h"
#include "tables.h"

namespace cpu_dist::ps {

class RowAccumulator;  // merge.h

// A chunk's share of one table: `count` consecutive keys of the chunk's keys (and their rows
// of the table's dim in grads), the table's lr and optimizer for the step.
struct ChunkPart {
  ShardTable* table = nullptr;
  uint64_t count = 0;
  float lr = 0.0f;
  OptimizerKind optimizer = OptimizerKind::kSgd;
};

// One chunk as it arrived (already checked for sizes, dim and values by the service).  Its
// parts name every table of the step (a step covers all of a job's tables, each chunk names
// the same tables in the same order with the same lr and optimizer; a table may have no keys
// in a chunk); a one-table request is one part.
struct CommitChunk {
  uint64_t session = 0;
  int64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t chunk_index = 0;
  uint32_t chunk_count = 0;
  uint32_t max_ahead = 1;  // accepted steps: committed + 1 .. committed + max_ahead
  int64_t base_step = 0;   // the job step of the session's step 0 (table_rules.h)
  std::vector<ChunkPart> parts;
  std::string keys;   // int64[n], raw, part after part
  std::string grads;  // float32 rows, part after part, each at its table's dim
};

struct SessionLimits {
  size_t max_sessions = 1024;  // live sessions; a new one evicts the least recently active
  uint64_t max_held_bytes = 1ull << 30;  // per session: chunks of steps after committed + 1
  // Per session: the pending step's chunks (committed + 1); a chunk beyond fails the session.
  uint64_t max_pending_bytes = 1ull << 30;
};

class CommitSessions {
 public:
  using Clock = std::chrono::steady_clock;
  // Called once per waiter with the session's committed step (outside every lock), and a
  // non-OK status when the step can never commit (session ended, or failed to apply).
  using WaitCallback = std::function<void(int64_t committed, const grpc::Status& status)>;

  // Wire values are capped before anything is allocated for them.
  static constexpr uint32_t kMaxWorldSize = 1u << 16;
  static constexpr uint32_t kMaxChunkCount = 1u << 20;
  static constexpr uint32_t kMaxAhead = kMaxCommitAhead;
  static constexpr int64_t kMaxStep = int64_t{1} << 62;  // step and base_step, so no sum wraps

  CommitSessions(ShardTables& tables, SessionLimits limits) : tables_(tables), limits_(limits) {}

  // Acknowledges (and possibly applies) one chunk; on success *committed is the session's
  // committed step after this call.  Takes the chunk's payload by move.  An ended session is
  // never re-created: its chunks are refused (FAILED_PRECONDITION) unless they retry a step
  // that was committed.  A step that fails to apply is applied not at all, and fails the
  // session: this and every later chunk and waiter get that error.
  // With wait false it throws WouldBlock instead of waiting on a lock (the session's, the
  // table's); the chunk is then untouched, or stored and its step left to apply: sending the
  // same chunk again (with wait) finishes the job (an identical retry applies a ready step).
  grpc::Status commit(CommitChunk&& chunk, int64_t* committed, size_t* rows_applied,
                      bool wait = true);

  // Current committed step of a session (-1 if it never committed or is unknown).
  int64_t committed(uint64_t session) const;
  // The committed step and the job step of the session's step 0 (its base_step), read
  // together; base is 0 while nothing is committed (nothing of the session is in any row).
  // `open`: the session may still apply commits (false once it ended, or never existed).
  struct Position {
    int64_t committed = -1;
    int64_t base = 0;
    bool open = false;
  };
  Position position(uint64_t session) const;
  // What bounds the session's steps in rows a pull gathered after reading its Position: read
  // after the gather, from atomics and the session's constants (never its mutex, which an
  // applying step holds).  A row whose last-update job step is L holds the session's step
  // L - base only if L - base <= begun (the step had begun to apply when the gather ended),
  // and only if L > others_upto, above every job step another session may have left in rows.
  struct Writes {
    bool known = false;  // the session exists or ended here (its base is fixed)
    int64_t base = 0;
    int64_t begun = -1;             // the highest step whose apply began
    int64_t others_upto = kNoStep;  // INT64_MAX: any step may be another session's
  };
  Writes writes(uint64_t session) const;

  // Calls `done` at once (returning 0) if `step` is committed, otherwise registers a waiter
  // and returns its id (> 0); `done` then runs on commit or at expire_waiters past `deadline`.
  uint64_t wait(uint64_t session, int64_t step, Clock::time_point deadline, WaitCallback done);
  // Removes a waiter without calling it; false if it already ran (or is running).
  bool cancel_wait(uint64_t id);
  // Finishes every waiter whose deadline has passed (or all of them with `all`).
  void expire_waiters(Clock::time_point now, bool all = false);

  // Marks `rank` closed; the session ends when all ranks closed, or when any closed and no
  // step is pending or held (or it failed); its waiters then get FAILED_PRECONDITION.
  // Returns the committed step (-1 for a session this shard never saw).
  grpc::Status close(uint64_t session, uint32_t rank, int64_t* committed);
  // Ends every session idle (no chunk, wait or close) for longer than `idle`: its chunks are
  // dropped and its waiters fail.  Returns how many ended.
  size_t expire_idle(Clock::time_point now, Clock::duration idle);
  // Ends every open session (a job takes the shard over); waiters get ABORTED.
  size_t abort_all();

  size_t live_sessions() const;
  size_t waiters() const;  // long polls parked

  // Steps applied since the shard started (every session) and the wall time their applies
  // took: the ranks' rows summed, then the tables updated, from the call that completed the
  // step.  What a worker's commit wait is made of when the shard is not kept waiting.
  struct Applies {
    uint64_t steps = 0;
    uint64_t ns = 0;
  };
  Applies applies() const {
    return {applied_steps_.load(std::memory_order_relaxed),
            apply_ns_.load(std::memory_order_relaxed)};
  }

 private:
  // Sparse (maps, not vectors sized from the wire): memory follows what actually arrived.
  struct RankSlot {
    uint32_t chunk_count = 0;
    std::map<uint32_t, CommitChunk> chunks;  // by chunk_index
  };
  // One step's chunks; its tables, their lr and optimizer are fixed by its first chunk
  // (`tables`, whose counts are unused).
  struct StepChunks {
    std::vector<ChunkPart> tables;
    std::map<uint32_t, RankSlot> ranks;  // ranks heard from
    uint32_t complete_ranks = 0;         // of those, with every chunk in
    uint64_t bytes = 0;                  // payload bytes stored
  };
  struct Session {
    std::mutex mu;
    uint32_t world_size = 0;
    int64_t base_step = 0;  // fixed by the session's first chunk
    std::atomic<int64_t> committed{-1};
    std::atomic<int64_t> last_active{0};  // Clock ticks of the last chunk, wait or close
    // Row ownership (Writes): the highest step whose apply began; the shard's applies begun
    // (by any session) when this one was created and by this one since; the highest job step
    // in any row at creation.  All fixed or atomic: a pull reads them without mu.
    std::atomic<int64_t> begun{-1};
    uint64_t applies_before = 0;
    std::atomic<uint64_t> own_applies{0};
    int64_t others_upto = kNoStep;
    std::map<int64_t, StepChunks> steps;  // committed + 1 (pending) and later (held)
    uint64_t bytes = 0;                   // payload bytes of every stored step
    std::vector<bool> closed;
    bool dropped = false;  // set under mu when the session ends: chunks must not land here
    grpc::Status failed;   // non-OK once a step failed to apply: the session is dead
  };
  // How a session ended, remembered for its late chunks and waits.
  struct Ended {
    int64_t committed = -1;
    std::string why;  // empty: closed by its ranks
    bool aborted = false;
    int64_t base = 0;  // the session's base_step
  };
  struct Waiter {
    uint64_t session;
    int64_t step;
    Clock::time_point deadline;
    WaitCallback done;
  };

  // What store() made of a chunk.
  enum class Stored { kAcknowledged, kHeld, kStepReady };

  // ---- the chunk path (commit.cc) ----
  // The chunk's own fields, before any state is looked at.
  static grpc::Status validate(const CommitChunk& c);
  // Caller holds s.mu.  Takes the chunk into its step (kStepReady when it completed the
  // pending step), acknowledges a retry (kAcknowledged), or refuses it.
  grpc::Status store(Session& s, CommitChunk&& c, Stored* out);
  // Refusals that need the session but not the step: a failed session, another world_size,
  // a step outside the window.
  static grpc::Status check_step(const Session& s, const CommitChunk& c);
  // Refusals that need the step and rank: another chunk_count, a conflicting retry of a
  // stored chunk, other tables, lr or optimizer than the step's.  *retry: an identical retry.
  static grpc::Status check_chunk(const StepChunks* step, const RankSlot* slot,
                                  const CommitChunk& c, bool* retry);
  // Refuses a held step's chunk that would take the session past max_held_bytes.
  grpc::Status check_held_bytes(const Session& s, const CommitChunk& c, uint64_t bytes) const;
  // Caller holds s.mu.  A pending step's chunk that would take it past max_pending_bytes fails
  // the session (the step can never be applied whole): that status.
  grpc::Status check_pending_bytes(Session& s, const CommitChunk& c, uint64_t bytes) const;
  // Caller holds s.mu.  Applies the pending step and every held step complete after it, in
  // order; on a failure the session fails and that status is returned.
  // *steps: how many applied; *blocked (without wait): it stopped at a step it would have had
  // to wait for, before any change of that step.
  grpc::Status apply_ready(Session& s, uint64_t session, size_t* rows_applied, size_t* steps,
                           bool wait, bool* blocked);
  // Throws; the tables are unchanged then (but for expiry drops: ShardTable::commit_step).
  size_t apply_step(Session& s, int64_t step, StepChunks& chunks, bool wait);
  // Every rank's rows rise: per table the ranks' rows merged and summed per key in rank
  // order, / world; false where some rank's do not (then accumulate).
  static bool merge_rising(const StepChunks& chunks, uint32_t world_size,
                           std::vector<std::vector<int64_t>>& keys,
                           std::vector<std::vector<float>>& grads);
  // Otherwise: per table, the chunks' rows summed in rank order, then chunk order, / world.
  static void accumulate(const StepChunks& chunks, uint32_t world_size,
                         std::vector<RowAccumulator>& acc);
  // *out is null (and *ended its end) when the session ended.  Evicts the least recently
  // active session when the cap is reached.
  grpc::Status find_or_create(const CommitChunk& c, std::shared_ptr<Session>* out, Ended* ended,
                              bool wait);

  // ---- lifecycle (sessions.cc) ----
  // Committed step, and non-OK when the session ended or failed.
  grpc::Status state(uint64_t session, int64_t* committed) const;
  void notify(uint64_t session, int64_t committed);
  // Finishes every waiter of `session` with `status`.
  void fail_waiters(uint64_t session, const grpc::Status& status);
  // Ends `s` (unless it already ended): drops its chunks, then forget().  Caller holds no
  // lock.  False if it had already ended.
  bool end_session(uint64_t session, const std::shared_ptr<Session>& s, Ended how);
  // After `s` was marked dropped under its mutex (now released): no longer live, `how`
  // remembered, waiters failed.  Caller holds no lock.
  void forget(uint64_t session, const std::shared_ptr<Session>& s, const Ended& how);
  static grpc::Status ended_status(uint64_t session, const Ended& how);
  static void touch(Session& s);

  ShardTables& tables_;
  const SessionLimits limits_;
  // sessions_, ended_ and ended_order_.  A leaf lock: nothing is locked while it is held.
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
  std::map<uint64_t, Ended> ended_;   // ended sessions (the most recent 4096)
  std::deque<uint64_t> ended_order_;  // oldest first
  // Steps whose apply began, over every session (Writes: another session's apply since).
  std::atomic<uint64_t> applies_begun_{0};
  std::atomic<uint64_t> applied_steps_{0};  // applies(): counted once a step is in the rows
  std::atomic<uint64_t> apply_ns_{0};
  mutable std::mutex waiters_mu_;
  uint64_t next_waiter_ = 1;
  std::map<uint64_t, Waiter> waiters_;
};

}  // namespace cpu_dist::ps
