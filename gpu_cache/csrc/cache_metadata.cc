#include "cache_metadata.h"

#include <algorithm>
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
  order_.clear();
  free_.clear();
  free_.reserve(static_cast<size_t>(capacity_));
  for (int64_t s = capacity_ - 1; s >= 0; --s) free_.push_back(s);  // slot 0 handed out first
  for (auto& k : key_of_slot_) k = -1;
}

void CacheMetadata::place(int64_t key, int64_t slot, int64_t score) {
  slot_of_[key] = slot;
  key_of_slot_[static_cast<size_t>(slot)] = key;
  score_of_slot_[static_cast<size_t>(slot)] = score;
  order_.emplace(score, slot);
}

void CacheMetadata::remove_slot(int64_t slot) {
  const size_t s = static_cast<size_t>(slot);
  order_.erase({score_of_slot_[s], slot});
  slot_of_.erase(key_of_slot_[s]);
  key_of_slot_[s] = -1;
}

QueryResult CacheMetadata::query(const int64_t* keys, size_t n, const int64_t* scores) {
  QueryResult r;
  for (size_t i = 0; i < n; ++i) {
    auto it = slot_of_.find(keys[i]);
    if (it == slot_of_.end()) continue;
    const int64_t slot = it->second;
    const size_t s = static_cast<size_t>(slot);
    const int64_t score = scores ? scores[i] : ++tick_;
    if (score != score_of_slot_[s]) {
      order_.erase({score_of_slot_[s], slot});
      score_of_slot_[s] = score;
      order_.emplace(score, slot);
    }
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

AdmitResult CacheMetadata::admit(const int64_t* keys, size_t n, const int64_t* scores,
                                 int64_t max_admit, bool score_gate) {
  AdmitResult r;
  absl::flat_hash_map<int64_t, int64_t> source_of_slot;  // slots filled by this call
  std::vector<int64_t> slot_order;                       // first-fill order, for stable output
  int64_t admitted = 0;
  for (size_t i = 0; i < n && admitted < max_admit; ++i) {
    const int64_t key = keys[i];
    if (slot_of_.contains(key)) continue;
    const int64_t score = scores ? scores[i] : ++tick_;
    int64_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      const auto victim = *order_.begin();
      if (score_gate && victim.first >= score) continue;  // the resident row is needed sooner
      slot = victim.second;
      const int64_t old_key = key_of_slot_[static_cast<size_t>(slot)];
      if (!source_of_slot.contains(slot)) r.evicted.push_back(old_key);
      remove_slot(slot);
    }
    place(key, slot, score);
    auto [it, inserted] = source_of_slot.try_emplace(slot, static_cast<int64_t>(i));
    if (inserted) slot_order.push_back(slot);
    else it->second = static_cast<int64_t>(i);
    ++admitted;
  }
  r.slot = std::move(slot_order);
  r.src.reserve(r.slot.size());
  for (int64_t s : r.slot) r.src.push_back(source_of_slot.at(s));
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
