// Sums gradient rows per key in the order they are added.  Push and commit both go through
// this, so duplicates are merged identically everywhere: the first occurrence is copied,
// later ones are added in arrival-independent (caller-defined) order.
#pragma once

#include <cstdint>
#include <cstring>
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

}  // namespace cpu_dist::ps
