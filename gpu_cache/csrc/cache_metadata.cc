#include "cache_metadata.h"

#include <algorithm>
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
}

void CacheMetadata::place(int64_t key, int64_t slot, int64_t score) {
  slot_of_[key] = slot;
  key_of_slot_[static_cast<size_t>(slot)] = key;
  score_of_slot_[static_cast<size_t>(slot)] = score;
}

void CacheMetadata::remove_slot(int64_t slot) {
  const size_t s = static_cast<size_t>(slot);
  slot_of_.erase(key_of_slot_[s]);
  key_of_slot_[s] = -1;
}

QueryResult CacheMetadata::query(const int64_t* keys, size_t n, const int64_t* scores) {
  QueryResult r;
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

std::vector<std::pair<int64_t, int64_t>> CacheMetadata::victims(size_t k) const {
  std::vector<std::pair<int64_t, int64_t>> all;
  all.reserve(slot_of_.size());
  for (const auto& [key, slot] : slot_of_) all.emplace_back(score_of_slot_[static_cast<size_t>(slot)], slot);
  k = std::min(k, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.end());
  all.resize(k);
  return all;
}

AdmitResult CacheMetadata::admit(const int64_t* keys, size_t n, const int64_t* scores,
                                 int64_t max_admit, bool score_gate) {
  // Candidates: first occurrence of each non-resident key, in the order they will be tried.
  std::vector<int64_t> cand;
  {
    absl::flat_hash_map<int64_t, bool> seen;
    for (size_t i = 0; i < n; ++i)
      if (!slot_of_.contains(keys[i]) && seen.try_emplace(keys[i], true).second)
        cand.push_back(static_cast<int64_t>(i));
  }
  if (score_gate && scores)
    std::stable_sort(cand.begin(), cand.end(),
                     [scores](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  if (max_admit < 0) max_admit = 0;
  if (static_cast<int64_t>(cand.size()) > max_admit) cand.resize(static_cast<size_t>(max_admit));
  // Sequential LRU over more keys than slots: only the last `capacity` survive the call;
  // gated admission stops at the capacity anyway (later candidates score no better).
  if (static_cast<int64_t>(cand.size()) > capacity_) {
    if (score_gate) cand.resize(static_cast<size_t>(capacity_));
    else cand.erase(cand.begin(), cand.end() - capacity_);
  }
  const size_t n_free = free_.size();
  const size_t n_evict = cand.size() > n_free ? cand.size() - n_free : 0;
  const auto vict = victims(n_evict);
  AdmitResult r;
  size_t next_victim = 0;
  for (int64_t pos : cand) {
    const int64_t score = scores ? scores[pos] : ++tick_;
    int64_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      if (next_victim == vict.size()) break;
      const auto& v = vict[next_victim];
      if (score_gate && v.first >= score) break;  // every later candidate scores no better
      ++next_victim;
      slot = v.second;
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
    auto it = slot_of_.find(k);  // -1 marks a free slot unless key -1 itself lives there
    if (it == slot_of_.end() || it->second != s) continue;
    out.first.push_back(k);
    out.second.push_back(s);
  }
  return out;
}

void CacheMetadata::record_updates(const int64_t* keys, size_t n, int64_t step) {
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = last_update_.try_emplace(keys[i], step);
    if (!inserted && step > it->second) it->second = step;
  }
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
