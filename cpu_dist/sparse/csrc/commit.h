// Ordered commit sessions: every rank sends its sparse gradients of step t in chunks; the
// shard applies step t only when all ranks' chunks are in, summing per key in rank order
// then chunk order (so the bits depend neither on arrival order nor on chunking), dividing
// by world_size and running the optimizer once per row.  Everything is validated on arrival
// so that applying a step cannot fail half way.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "grpcpp/support/status.h"
#include "optimizer.h"
#include "table.h"

namespace cpu_dist::ps {

// One chunk as it arrived (already checked for sizes and dim by the service).
struct CommitChunk {
  uint64_t session = 0;
  int64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t chunk_index = 0;
  uint32_t chunk_count = 0;
  float lr = 0.0f;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  std::string keys;   // int64[n], raw
  std::string grads;  // float32[n][dim], raw
};

class CommitSessions {
 public:
  using Clock = std::chrono::steady_clock;
  // Called once per waiter with the session's committed step (outside every lock), and a
  // non-OK status when the step can never commit (session closed, or failed to apply).
  using WaitCallback = std::function<void(int64_t committed, const grpc::Status& status)>;

  // Wire values are capped before anything is allocated for them.
  static constexpr uint32_t kMaxWorldSize = 1u << 16;
  static constexpr uint32_t kMaxChunkCount = 1u << 20;
  static constexpr size_t kMaxLiveSessions = 1024;

  explicit CommitSessions(ShardTable& table) : table_(table) {}

  // Acknowledges (and possibly applies) one chunk; on success *committed is the session's
  // committed step after this call.  Takes the chunk's payload by move.  A closed session is
  // never re-created: its chunks are refused (FAILED_PRECONDITION) unless they retry a step
  // that was committed.  A step that fails to apply is applied not at all, and fails the
  // session: this and every later chunk and waiter get that error.
  grpc::Status commit(CommitChunk&& chunk, int64_t* committed, size_t* rows_applied);

  // Current committed step of a session (-1 if it never committed or is unknown).
  int64_t committed(uint64_t session) const;

  // Calls `done` at once (returning 0) if `step` is committed, otherwise registers a waiter
  // and returns its id (> 0); `done` then runs on commit or at expire_sweep past `deadline`.
  uint64_t wait(uint64_t session, int64_t step, Clock::time_point deadline, WaitCallback done);
  // Removes a waiter without calling it; false if it already ran (or is running).
  bool cancel_wait(uint64_t id);
  // Finishes every waiter whose deadline has passed (or all of them with `all`).
  void expire_waiters(Clock::time_point now, bool all = false);

  // Marks `rank` closed; the session is dropped when all ranks closed, or when any closed
  // and nothing is pending (or it failed); its waiters then get FAILED_PRECONDITION.
  // Returns the committed step (-1 for a session this shard never saw).
  grpc::Status close(uint64_t session, uint32_t rank, int64_t* committed);

  size_t live_sessions() const;

 private:
  // Sparse (maps, not vectors sized from the wire): memory follows what actually arrived.
  struct RankSlot {
    uint32_t chunk_count = 0;
    std::map<uint32_t, CommitChunk> chunks;  // by chunk_index
  };
  struct Session {
    std::mutex mu;
    uint32_t world_size = 0;
    std::atomic<int64_t> committed{-1};
    // The pending step (committed + 1): its lr/optimizer are fixed by its first chunk.
    bool has_pending = false;
    float lr = 0.0f;
    OptimizerKind optimizer = OptimizerKind::kSgd;
    std::map<uint32_t, RankSlot> ranks;  // ranks heard from for the pending step
    uint32_t complete_ranks = 0;         // of those, with every chunk in
    std::vector<bool> closed;
    bool dropped = false;  // set by close() under mu: commits must not land here any more
    grpc::Status failed;   // non-OK once a step failed to apply: the session is dead
  };
  struct Waiter {
    uint64_t session;
    int64_t step;
    Clock::time_point deadline;
    WaitCallback done;
  };

  // What store() made of a chunk.
  enum class Stored { kAcknowledged, kPending, kStepComplete };

  // The chunk's own fields, before any state is looked at.
  static grpc::Status validate(const CommitChunk& c);
  // Caller holds s.mu.  Takes the chunk into the pending step (kPending, or kStepComplete
  // when it was the last one missing), acknowledges a retry (kAcknowledged), or refuses it.
  grpc::Status store(Session& s, CommitChunk&& c, Stored* out);
  // Refusals that need the session but not the rank: a failed session, another
  // world_size, a step past the pending one.
  static grpc::Status check_step(const Session& s, const CommitChunk& c);
  // Refusals that need the rank's slot: another chunk_count, a conflicting retry of a stored
  // chunk, another lr or optimizer than the pending step's.  *retry: an identical retry.
  static grpc::Status check_chunk(const Session& s, const RankSlot* slot, const CommitChunk& c,
                                  bool* retry);
  // Caller holds s.mu; every rank's chunks are in.  Applies the step, or fails the session.
  grpc::Status apply_step(Session& s, uint64_t session, int64_t step, size_t* rows_applied);

  // *out is null (and *closed_at its final step) when the session was closed and dropped.
  grpc::Status find_or_create(uint64_t session, uint32_t world_size, std::shared_ptr<Session>* out,
                              int64_t* closed_at);
  // Committed step, and non-OK when the session is closed or failed.
  grpc::Status state(uint64_t session, int64_t* committed) const;
  size_t apply_pending(Session& s);  // caller holds s.mu; every chunk is present
  void notify(uint64_t session, int64_t committed);
  // Finishes every waiter of `session` with `status`.
  void fail_waiters(uint64_t session, const grpc::Status& status);

  ShardTable& table_;
  mutable std::mutex mu_;  // sessions_ and closed_
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
  std::map<uint64_t, int64_t> closed_;  // final committed step of dropped sessions (bounded)
  std::mutex waiters_mu_;
  uint64_t next_waiter_ = 1;
  std::map<uint64_t, Waiter> waiters_;
};

}  // namespace cpu_dist::ps
