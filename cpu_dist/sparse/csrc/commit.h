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
  // Called once per waiter with the session's committed step (outside every lock).
  using WaitCallback = std::function<void(int64_t committed)>;

  explicit CommitSessions(ShardTable& table) : table_(table) {}

  // Acknowledges (and possibly applies) one chunk; on success *committed is the session's
  // committed step after this call.  Takes the chunk's payload by move.
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
  // and nothing is pending.  Returns the committed step.
  grpc::Status close(uint64_t session, uint32_t rank, int64_t* committed);

  size_t live_sessions() const;

 private:
  struct RankSlot {
    uint32_t chunk_count = 0;  // 0: nothing received yet for the pending step
    uint32_t received = 0;
    std::vector<std::optional<CommitChunk>> chunks;
  };
  struct Session {
    std::mutex mu;
    uint32_t world_size = 0;
    std::atomic<int64_t> committed{-1};
    // The pending step (committed + 1): its lr/optimizer are fixed by its first chunk.
    bool has_pending = false;
    float lr = 0.0f;
    OptimizerKind optimizer = OptimizerKind::kSgd;
    std::vector<RankSlot> ranks;
    std::vector<bool> closed;
  };
  struct Waiter {
    uint64_t session;
    int64_t step;
    Clock::time_point deadline;
    WaitCallback done;
  };

  std::shared_ptr<Session> find_or_create(uint64_t session, uint32_t world_size);
  size_t apply_pending(Session& s);  // caller holds s.mu; every chunk is present
  void notify(uint64_t session, int64_t committed);

  ShardTable& table_;
  mutable std::mutex mu_;  // sessions_ and closed_
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
  std::map<uint64_t, int64_t> closed_;  // final committed step of dropped sessions (bounded)
  std::mutex waiters_mu_;
  uint64_t next_waiter_ = 1;
  std::map<uint64_t, Waiter> waiters_;
};

}  // namespace cpu_dist::ps
