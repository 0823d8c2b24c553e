// Sums gradient rows per key in the order they are added.  Push and commit both go through
// this, so duplicates are merged identically everywhere: the first occurrence is copied,
// later ones are added in arrival-independent (caller-defined) order.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace cpu_dist::ps {

class RowAccumulator {
 public:
  explicit RowAccumulator(uint32_t dim) : dim_(dim), tmp_(dim) {}

  void reserve(size_t n) {
    index_.reserve(n);
    keys_.reserve(n);
    sums_.reserve(n * dim_);
  }

  // `keys` and `grads` may be unaligned (it often points into a protobuf bytes field).
  void add(const void* keys, const void* grads, size_t n) {
    const char* k = static_cast<const char*>(keys);
    const char* g = static_cast<const char*>(grads);
    const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
    for (size_t i = 0; i < n; ++i, g += row_bytes) {
      int64_t key;
      std::memcpy(&key, k + i * sizeof(key), sizeof(key));
      auto [it, inserted] = index_.try_emplace(key, static_cast<uint32_t>(keys_.size()));
      if (inserted) {
        keys_.push_back(key);
        sums_.resize(sums_.size() + dim_);
        std::memcpy(&sums_[static_cast<size_t>(it->second) * dim_], g, row_bytes);
      } else {
        std::memcpy(tmp_.data(), g, row_bytes);
        float* s = &sums_[static_cast<size_t>(it->second) * dim_];
        for (uint32_t c = 0; c < dim_; ++c) s[c] += tmp_[c];
      }
    }
  }

  void divide(float d) {
    for (float& v : sums_) v /= d;
  }

  size_t size() const { return keys_.size(); }
  const std::vector<int64_t>& keys() const { return keys_; }
  const std::vector<float>& sums() const { return sums_; }

 private:
  uint32_t dim_;
  absl::flat_hash_map<int64_t, uint32_t> index_;
  std::vector<int64_t> keys_;
  std::vector<float> sums_;
  std::vector<float> tmp_;
};

// One rank's rows of one table, chunk after chunk, while their keys rise strictly (a worker
// sends its sorted unique keys): `rising` turns false at the first key that does not.
struct RisingRun {
  std::vector<int64_t> keys;
  std::vector<const char*> rows;  // each key's gradient row (possibly unaligned)
  bool rising = true;

  void add(const void* keys_in, const void* grads, size_t n, uint32_t dim) {
    const char* k = static_cast<const char*>(keys_in);
    const char* g = static_cast<const char*>(grads);
    const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
    for (size_t i = 0; i < n && rising; ++i) {
      int64_t key;
      std::memcpy(&key, k + i * sizeof(key), sizeof(key));
      rising = keys.empty() || key > keys.back();
      keys.push_back(key);
      rows.push_back(g + i * row_bytes);
    }
  }
};

// The rows of rising runs (one per rank, in rank order) summed per key in run order, the
// first row copied and later ones added, as RowAccumulator adds them run after run, bit for
// bit; but by merging the runs instead of one hash insert per row.  Keys come out sorted.
inline void merge_runs(const std::vector<RisingRun>& runs, uint32_t dim, std::vector<int64_t>& keys,
                       std::vector<float>& sums) {
  size_t total = 0;
  for (const RisingRun& r : runs) total += r.keys.size();
  keys.reserve(total);
  sums.reserve(total * dim);
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  std::vector<float> tmp(dim);
  // (key, run): the smallest key first and, for equal keys, the lower run (rank) first
  using Head = std::pair<int64_t, size_t>;
  std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
  std::vector<size_t> at(runs.size(), 0);
  for (size_t r = 0; r < runs.size(); ++r)
    if (!runs[r].keys.empty()) heads.emplace(runs[r].keys[0], r);
  while (!heads.empty()) {
    const auto [key, r] = heads.top();
    heads.pop();
    const char* row = runs[r].rows[at[r]];
    if (++at[r] < runs[r].keys.size()) heads.emplace(runs[r].keys[at[r]], r);
    if (!keys.empty() && keys.back() == key) {
      std::memcpy(tmp.data(), row, row_bytes);
      float* s = &sums[sums.size() - dim];
      for (uint32_t c = 0; c < dim; ++c) s[c] += tmp[c];
    } else {
      keys.push_back(key);
      sums.resize(sums.size() + dim);
      std::memcpy(&sums[sums.size() - dim], row, row_bytes);
    }
  }
}

}  // namespace cpu_dist::ps
