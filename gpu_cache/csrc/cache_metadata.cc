#include "cache_metadata.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace gpu_cache {

CacheMetadata::CacheMetadata(int64_t capacity_rows) : capacity_(capacity_rows) {
  if (capacity_rows <= 0)
    throw std::invalid_argument("cache capacity must be positive, got " +
                                std::to_string(capacity_rows) + " rows");
  key_of_slot_.assign(static_cast<size_t>(capacity_), -1);
  score_of_slot_.assign(static_cast<size_t>(capacity_), 0);
  slot_of_.reserve(static_cast<size_t>(capacity_));
  clear();
}

void CacheMetadata::clear() {
  slot_of_.clear();
  free_.clear();
  free_.reserve(static_cast<size_t>(capacity_));
  for (int64_t s = capacity_ - 1; s >= 0; --s) free_.push_back(s);  // slot 0 handed out first
  for (auto& k : key_of_slot_) k = -1;
  used_.assign(static_cast<size_t>(capacity_), 0);
}

void CacheMetadata::place(int64_t key, int64_t slot, int64_t score) {
  slot_of_[key] = slot;
  key_of_slot_[static_cast<size_t>(slot)] = key;
  used_[static_cast<size_t>(slot)] = 1;
  score_of_slot_[static_cast<size_t>(slot)] = score;
}

void CacheMetadata::remove_slot(int64_t slot) {
  const size_t s = static_cast<size_t>(slot);
  slot_of_.erase(key_of_slot_[s]);
  key_of_slot_[s] = -1;
  used_[s] = 0;
}

QueryResult CacheMetadata::query(const int64_t* keys, size_t n, const int64_t* scores) {
  QueryResult r;
  const size_t expect = std::min(n, slot_of_.size());
  r.hit_pos.reserve(expect);
  r.hit_slot.reserve(expect);
  for (size_t i = 0; i < n; ++i) {
    auto it = slot_of_.find(keys[i]);
    if (it == slot_of_.end()) continue;
    const int64_t slot = it->second;
    score_of_slot_[static_cast<size_t>(slot)] = scores ? scores[i] : ++tick_;
    r.hit_pos.push_back(static_cast<int64_t>(i));
    r.hit_slot.push_back(slot);
  }
  return r;
}

std::vector<int64_t> CacheMetadata::lookup(const int64_t* keys, size_t n) const {
  std::vector<int64_t> out(n, -1);
  for (size_t i = 0; i < n; ++i) {
    auto it = slot_of_.find(keys[i]);
    if (it != slot_of_.end()) out[i] = it->second;
  }
  return out;
}

int64_t CacheMetadata::sgd_resident(const int64_t* keys, size_t n, const float* grads, float lr,
                                    float divisor, const RowMatrix& rows) const {
  if (rows.rows < capacity_)
    throw std::invalid_argument("row matrix has " + std::to_string(rows.rows) +
                                " rows, the cache " + std::to_string(capacity_));
  int64_t updated = 0;
  for (size_t i = 0; i < n; ++i) {
    auto it = slot_of_.find(keys[i]);
    if (it == slot_of_.end()) continue;
    sgd_row(rows.data + it->second * rows.dim, grads + static_cast<int64_t>(i) * rows.dim, rows.dim,
            lr, divisor);
    ++updated;
  }
  return updated;
}

std::vector<std::pair<int64_t, int64_t>> CacheMetadata::victim_heap(int64_t below) const {
  std::vector<std::pair<int64_t, int64_t>> heap;
  heap.reserve(slot_of_.size());
  for (size_t s = 0; s < used_.size(); ++s)
    if (used_[s] && score_of_slot_[s] < below)
      heap.emplace_back(score_of_slot_[s], static_cast<int64_t>(s));
  std::make_heap(heap.begin(), heap.end(), std::greater<>());  // O(n); popped lazily
  return heap;
}

AdmitResult CacheMetadata::admit(const int64_t* keys, size_t n, const int64_t* scores,
                                 int64_t max_admit, bool score_gate) {
  // Candidates: first occurrence of each non-resident key.
  std::vector<int64_t> cand;
  cand.reserve(n);
  bool increasing = true;  // the controller's keys are sorted unique: no duplicate check needed
  for (size_t i = 1; i < n && increasing; ++i) increasing = keys[i - 1] < keys[i];
  if (increasing) {
    for (size_t i = 0; i < n; ++i)
      if (!slot_of_.contains(keys[i])) cand.push_back(static_cast<int64_t>(i));
  } else {
    absl::flat_hash_map<int64_t, bool> seen;
    seen.reserve(n);
    for (size_t i = 0; i < n; ++i)
      if (!slot_of_.contains(keys[i]) && seen.try_emplace(keys[i], true).second)
        cand.push_back(static_cast<int64_t>(i));
  }
  if (max_admit < 0) max_admit = 0;
  const bool gated = score_gate && scores != nullptr;
  // How many candidates are tried, and in what order: gated, best score first (ties: earlier
  // position) and at most min(max_admit, capacity), since later ones score no better;
  // sequential LRU keeps the first max_admit and of those, over more keys than slots, only
  // the last `capacity` survive the call.
  size_t take = std::min(cand.size(), static_cast<size_t>(max_admit));
  size_t first = 0;
  if (static_cast<int64_t>(take) > capacity_) {
    if (!gated) first = take - static_cast<size_t>(capacity_);
    take = static_cast<size_t>(capacity_);
  }
  // Gated candidates come off a heap: usually only a few are admitted before the gate closes,
  // so ordering all of them would be wasted work.
  auto better = [scores](int64_t a, int64_t b) {  // heap order: true when b goes before a
    return scores[a] < scores[b] || (scores[a] == scores[b] && a > b);
  };
  if (gated) std::make_heap(cand.begin(), cand.end(), better);
  size_t heap_end = cand.size();
  auto next_candidate = [&](size_t i) -> int64_t {
    if (!gated) return cand[first + i];
    std::pop_heap(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(heap_end), better);
    return cand[--heap_end];
  };
  // Victims: resident rows before this call, smallest (score, slot) first; gated admission
  // never evicts a row scoring at least the best candidate's, so only rows below it qualify.
  std::vector<std::pair<int64_t, int64_t>> vict;
  bool vict_built = false;
  AdmitResult r;
  const size_t n_free = free_.size();
  if (take > n_free) {
    const int64_t below = gated && !cand.empty() ? scores[cand.front()]  // heap top: the best
                                                 : std::numeric_limits<int64_t>::max();
    vict = victim_heap(below);
    vict_built = true;
  }
  r.slot.reserve(take);
  r.src.reserve(take);
  for (size_t i = 0; i < take; ++i) {
    const int64_t pos = next_candidate(i);
    const int64_t score = scores ? scores[pos] : ++tick_;
    int64_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      if (!vict_built || vict.empty()) break;
      const auto& v = vict.front();
      if (gated && v.first >= score) break;  // every later candidate scores no better
      slot = v.second;
      std::pop_heap(vict.begin(), vict.end(), std::greater<>());
      vict.pop_back();
      r.evicted.push_back(key_of_slot_[static_cast<size_t>(slot)]);
      remove_slot(slot);
    }
    place(keys[pos], slot, score);
    r.slot.push_back(slot);
    r.src.push_back(pos);
  }
  return r;
}

int64_t CacheMetadata::invalidate(const int64_t* keys, size_t n) {
  int64_t dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    auto it = slot_of_.find(keys[i]);
    if (it == slot_of_.end()) continue;
    const int64_t slot = it->second;
    remove_slot(slot);
    free_.push_back(slot);
    ++dropped;
  }
  return dropped;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> CacheMetadata::resident() const {
  std::pair<std::vector<int64_t>, std::vector<int64_t>> out;
  for (int64_t s = 0; s < capacity_; ++s) {
    const int64_t k = key_of_slot_[static_cast<size_t>(s)];
    if (!used_[static_cast<size_t>(s)]) continue;
    out.first.push_back(k);
    out.second.push_back(s);
  }
  return out;
}

void CacheMetadata::record_updates(const int64_t* keys, size_t n, int64_t step) {
  last_update_.reserve(last_update_.size() + n);
  std::vector<int64_t>& recorded = recorded_[step];
  recorded.insert(recorded.end(), keys, keys + n);
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = last_update_.try_emplace(keys[i], step);
    if (!inserted && step > it->second) it->second = step;
  }
}

int64_t CacheMetadata::prune_updates(int64_t committed) {
  int64_t dropped = 0;
  while (!recorded_.empty() && recorded_.begin()->first <= committed) {
    const int64_t step = recorded_.begin()->first;
    for (int64_t key : recorded_.begin()->second) {
      auto it = last_update_.find(key);
      // A key recorded again by a later step keeps that entry.
      if (it != last_update_.end() && it->second == step) {
        last_update_.erase(it);
        ++dropped;
      }
    }
    recorded_.erase(recorded_.begin());
  }
  return dropped;
}

std::vector<int64_t> CacheMetadata::previous_update(const int64_t* keys, size_t n) const {
  std::vector<int64_t> out(n, -1);
  for (size_t i = 0; i < n; ++i) {
    auto it = last_update_.find(keys[i]);
    if (it != last_update_.end()) out[i] = it->second;
  }
  return out;
}

}  // namespace gpu_cache
