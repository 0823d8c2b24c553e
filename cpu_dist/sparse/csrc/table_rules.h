// Admission and expiry of rows, defined on committed job steps so that they are the same for
// any number of workers and shards.  ShardTable::commit_step applies them; Push is not a step
// and is not subject to them.
//
// ---- The rules (the text docs/DESIGN.md quotes) ---------------------------------------------
// Options: admit_after N (0 or 1: off), expire_after S (0: off); both off by default.
// Job step: a commit session's step s is job step base_step + s (CommitRequest.base_step, the
//   job step of the session's step 0: a resumed job's session starts at the step it resumes at).
// When job step t commits (every rank's chunks in), with U = the union of the step's keys:
//  1. Count: every key of U without a row has its count raised by one (its last-seen step
//     becomes t).  A key with a row is admitted.  A key without a row is admitted when its
//     count reaches N (with admission off: at once); then its count is forgotten.
//  2. Apply: the aggregated gradient of every admitted key is applied (a key without a row starts
//     from its first-touch row, state 0), and the row's last-update step becomes t.  The
//     gradients of keys not admitted are dropped: they hold no row and read their first-touch
//     value.
//  3. Expire (S > 0): every row whose last update is at step t - S or earlier is dropped (it
//     reads its first-touch value again, its state is gone, and its count starts from 0), and so
//     is the count of every key without a row last seen at step t - S or earlier.
// Push is a direct update, not a step: it neither counts nor is refused admission, and it does
// not change a row's last-update step.  A row that only Push (or a version 1 checkpoint) made
// has no last-update step and never expires until a commit updates it.  Counts, last-update
// steps and last-seen steps are saved in checkpoints (format version 2) with their partition,
// so they survive resharding.
//
// ---- Cost ----------------------------------------------------------------------------------
// Nothing scans the table.  Counts exist only for keys without a row (a hash map, about 40
// bytes a key).  With expiry on, every row with a last-update step and every count sits in one
// bucket per step (a hash set per step, about 16 bytes a key): updating a row moves its key
// between two buckets (O(1)), and step t's expiry takes the buckets of steps <= t - S whole,
// so each step costs O(keys it touches + keys it expires).  With expiry off no bucket is kept.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace cpu_dist::ps {

struct RuleOptions {
  uint32_t admit_after = 0;
  uint32_t expire_after = 0;
};

class StepRules {
 public:
  explicit StepRules(RuleOptions o) : o_(o) {}

  const RuleOptions& options() const { return o_; }
  bool active() const { return o_.admit_after > 1 || o_.expire_after > 0; }
  bool expiring() const { return o_.expire_after > 0; }

  // Whether a key without a row is admitted by the step being committed (rule 1).
  bool admits(int64_t key) const;

  // Bookkeeping of step t once its rows are applied.  reserve() first, so that the calls after
  // it allocate nothing.
  void reserve(size_t keys);
  // An admitted key whose row was updated; old_step: its last-update step before (kNoStep for a
  // new row or one only Push touched).
  void row_updated(int64_t key, int64_t old_step, int64_t t);
  void key_waiting(int64_t key, int64_t t);  // a key of the step not admitted
  // Rule 3 at step t: the keys whose rows must be dropped; the expired counts are forgotten
  // here (*counts_dropped of them).
  std::vector<int64_t> expire(int64_t t, uint64_t* counts_dropped);

  size_t pending() const { return pending_.size(); }
  template <class Fn>  // fn(key, count, last_seen)
  void for_each_pending(Fn&& fn) const {
    for (const auto& [k, p] : pending_) fn(k, p.count, p.last_seen);
  }
  // Loading a checkpoint: a count, and a row's last-update step (kept for expiry).
  void restore_pending(int64_t key, int64_t count, int64_t last_seen);
  void restore_row(int64_t key, int64_t step);

  void swap(StepRules& other);

 private:
  struct Pending {
    int64_t count = 0;
    int64_t last_seen = 0;
  };
  using Buckets = std::map<int64_t, absl::flat_hash_set<int64_t>>;
  static void move(Buckets& b, int64_t key, int64_t from, int64_t to);

  RuleOptions o_;
  absl::flat_hash_map<int64_t, Pending> pending_;
  Buckets rows_by_step_;     // expiry only: keys of held rows by last-update step
  Buckets pending_by_step_;  // expiry only: keys of counts by last-seen step
};

}  // namespace cpu_dist::ps
