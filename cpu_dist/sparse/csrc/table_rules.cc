#include "table_rules.h"

#include <algorithm>
#include <utility>

#include "row_meta.h"

namespace cpu_dist::ps {

bool StepRules::admits(int64_t key) const {
  if (o_.admit_after <= 1) return true;
  const auto it = pending_.find(key);
  const int64_t count = (it != pending_.end() ? it->second.count : 0) + 1;
  return count >= static_cast<int64_t>(o_.admit_after);
}

void StepRules::reserve(size_t keys) {
  if (o_.admit_after > 1) pending_.reserve(pending_.size() + keys);
}

void StepRules::move(Buckets& b, int64_t key, int64_t from, int64_t to) {
  if (from != kNoStep) {
    auto it = b.find(from);
    if (it != b.end()) {
      it->second.erase(key);
      if (it->second.empty()) b.erase(it);
    }
  }
  if (to != kNoStep) b[to].insert(key);
}

void StepRules::row_updated(int64_t key, int64_t old_step, int64_t t) {
  if (!pending_.empty()) {
    auto it = pending_.find(key);
    if (it != pending_.end()) {
      if (expiring()) move(pending_by_step_, key, it->second.last_seen, kNoStep);
      pending_.erase(it);
    }
  }
  if (expiring()) move(rows_by_step_, key, old_step, t);
}

void StepRules::key_waiting(int64_t key, int64_t t) {
  Pending& p = pending_[key];
  const int64_t seen = p.count > 0 ? p.last_seen : kNoStep;
  ++p.count;
  p.last_seen = t;
  if (expiring()) move(pending_by_step_, key, seen, t);
}

std::vector<int64_t> StepRules::expire(int64_t t, uint64_t* counts_dropped) {
  *counts_dropped = 0;
  std::vector<int64_t> drop;
  if (!expiring()) return drop;
  const int64_t horizon = t - static_cast<int64_t>(o_.expire_after);
  while (!rows_by_step_.empty() && rows_by_step_.begin()->first <= horizon) {
    const auto& keys = rows_by_step_.begin()->second;
    drop.insert(drop.end(), keys.begin(), keys.end());
    rows_by_step_.erase(rows_by_step_.begin());
  }
  while (!pending_by_step_.empty() && pending_by_step_.begin()->first <= horizon) {
    for (int64_t k : pending_by_step_.begin()->second) *counts_dropped += pending_.erase(k);
    pending_by_step_.erase(pending_by_step_.begin());
  }
  std::sort(drop.begin(), drop.end());  // the drops of a step in one order, whatever the hashing
  return drop;
}

void StepRules::restore_pending(int64_t key, int64_t count, int64_t last_seen) {
  if (count <= 0) return;
  Pending& p = pending_[key];
  p.count = count;
  p.last_seen = last_seen;
  if (expiring()) move(pending_by_step_, key, kNoStep, last_seen);
}

void StepRules::restore_row(int64_t key, int64_t step) {
  if (expiring()) move(rows_by_step_, key, kNoStep, step);
}

void StepRules::swap(StepRules& other) {
  std::swap(o_, other.o_);
  pending_.swap(other.pending_);
  rows_by_step_.swap(other.rows_by_step_);
  pending_by_step_.swap(other.pending_by_step_);
}

}  // namespace cpu_dist::ps
