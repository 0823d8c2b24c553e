// CacheMetadata: which embedding rows a bounded cache holds, in which slot, and in what
// eviction order; plus each row's previous global update step.  Row values live elsewhere (a
// torch tensor on the cache device): this class only hands out slot numbers, so the same
// metadata serves a GPU or a CPU cache.
//
// Eviction order: every resident slot carries an int64 score and the slot with the smallest
// score goes first (ties: the lower slot).  Scores are plain per-slot numbers, so a hit costs
// O(1); victims come off a heap of the slots built once per admission call.  Callers that pass no
// scores get LRU (the score is a tick counted per key, so a batch behaves like its keys used one
// after another); prescan callers pass minus the next use step, which turns the same order into
// "evict the row whose next use is farthest away" (Belady within the plan window).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "row_kernels.h"

namespace gpu_cache {

struct QueryResult {
  std::vector<int64_t> hit_pos;   // positions in the query whose key is resident
  std::vector<int64_t> hit_slot;  // their slots, same order
};

struct AdmitResult {
  // One entry per destination slot (unique): the slot and the final source position in the
  // admitted batch.  A slot taken twice in one call (a batch larger than the cache) keeps
  // only its last source, so a scatter over these has unique destinations.
  std::vector<int64_t> slot;
  std::vector<int64_t> src;
  std::vector<int64_t> evicted;  // keys resident before the call that were dropped
};

class CacheMetadata {
 public:
  explicit CacheMetadata(int64_t capacity_rows);

  int64_t capacity() const { return capacity_; }
  int64_t size() const { return static_cast<int64_t>(slot_of_.size()); }

  // Looks up n keys; each hit's score becomes scores[i] (or the next LRU tick).
  QueryResult query(const int64_t* keys, size_t n, const int64_t* scores);
  // Slot of each key or -1; changes nothing.
  std::vector<int64_t> lookup(const int64_t* keys, size_t n) const;
  // Admits up to max_admit of n keys (resident and repeated keys are skipped).  Without a
  // gate this is sequential LRU: when more keys come than the cache holds, later keys displace
  // earlier ones of the same call and each slot reports only its last source.  With
  // score_gate the candidates go best score first and one is admitted only into a free slot or
  // over a victim whose score is lower (a row needed sooner never makes way for a later one).
  AdmitResult admit(const int64_t* keys, size_t n, const int64_t* scores, int64_t max_admit,
                    bool score_gate);
  // Drops these keys (those resident); returns how many were.
  int64_t invalidate(const int64_t* keys, size_t n);
  void clear();
  // Resident (key, slot) pairs, in slot order.
  std::pair<std::vector<int64_t>, std::vector<int64_t>> resident() const;

  // For each of n keys that is resident: rows[slot] -= lr * (grads[i] / divisor) (see
  // sgd_row).  grads is n x rows.dim; keys must be unique.  Returns how many were updated.
  int64_t sgd_resident(const int64_t* keys, size_t n, const float* grads, float lr, float divisor,
                       const RowMatrix& rows) const;

  // Previous global update step: record that step `step` updated these keys, and read back
  // the last recorded step of each key (-1: never updated, or updated by a committed step).
  void record_updates(const int64_t* keys, size_t n, int64_t step);
  std::vector<int64_t> previous_update(const int64_t* keys, size_t n) const;
  // Forgets every key whose last update is a step <= committed: a read of that row waits for
  // no commit, which is what -1 means too.  With it, the map holds only the keys of steps not
  // yet committed.  Returns how many keys were forgotten.
  int64_t prune_updates(int64_t committed);
  int64_t update_entries() const { return static_cast<int64_t>(last_update_.size()); }

 private:
  void remove_slot(int64_t slot);
  void place(int64_t key, int64_t slot, int64_t score);
  // The resident (score, slot) pairs scoring below `below`, as a min-heap (smallest first).
  std::vector<std::pair<int64_t, int64_t>> victim_heap(int64_t below) const;

  int64_t capacity_;
  int64_t tick_ = 0;
  absl::flat_hash_map<int64_t, int64_t> slot_of_;
  std::vector<int64_t> key_of_slot_;
  std::vector<int64_t> score_of_slot_;
  std::vector<uint8_t> used_;  // 1 where a slot holds a key
  std::vector<int64_t> free_;  // free slots, popped from the back
  absl::flat_hash_map<int64_t, int64_t> last_update_;
  std::map<int64_t, std::vector<int64_t>> recorded_;  // step -> keys recorded for it (unpruned)
};

}  // namespace gpu_cache
