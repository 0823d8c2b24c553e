// The early read's per-table passes (cpu_dist/sparse/reads.py, EarlyPull; the sole writer's
// read, cpu_dist/train/pipelines/sole_writer.py) in one linear pass each: which of step t+1's
// keys step t wrote, and the step's rows put back together from the pulls and the rows the
// worker already holds.  numpy did them with a binary search per key and masked copies,
// about 14 ms a step on the training thread in bench_models.py's 26-table job.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace cpu_dist::ps {

// out[i] = 1 where keys[i] is in written[0..m) (sorted ascending, distinct), else 0.  Keys
// sorted ascending merge in one pass; others search (the same answer, more slowly).
inline void mark_written(const int64_t* keys, size_t n, const int64_t* written, size_t m,
                         uint8_t* out) {
  const bool rising = std::is_sorted(keys, keys + n);
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = keys[i];
    if (rising) {
      while (j < m && written[j] < k) ++j;
      out[i] = j < m && written[j] == k;
    } else {
      const int64_t* at = std::lower_bound(written, written + m, k);
      out[i] = at != written + m && *at == k;
    }
  }
}

// Row i of out[n][dim] is the next unused row of late where written[i], of early otherwise
// (late holds count(written) rows, early the rest, each in key order).
inline void interleave_rows(const uint8_t* written, size_t n, const float* late, const float* early,
                            size_t dim, float* out) {
  const size_t row_bytes = dim * sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    const float*& from = written[i] ? late : early;
    std::memcpy(out + i * dim, from, row_bytes);
    from += dim;
  }
}

// Rows a worker holds: sorted ascending, distinct keys and their rows [m][dim].
struct HeldRows {
  const int64_t* keys;
  size_t m;
  const float* rows;
};

// Row i of out[n][dim] is keys[i]'s row in the first of levels[0..count) that holds it, else
// the next unused row of rest (rest_n rows, in key order).  keys sorted ascending, so each
// level merges in one pass.  Returns how many keys no level holds: out is complete only
// where that is rest_n.
inline size_t fill_rows(const int64_t* keys, size_t n, const HeldRows* levels, size_t count,
                        const float* rest, size_t rest_n, size_t dim, float* out) {
  const size_t row_bytes = dim * sizeof(float);
  std::vector<size_t> at(count, 0);  // a cursor per level
  size_t used = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = keys[i];
    const float* from = nullptr;
    for (size_t l = 0; l < count; ++l) {
      const HeldRows& h = levels[l];
      size_t& j = at[l];
      while (j < h.m && h.keys[j] < k) ++j;
      if (from == nullptr && j < h.m && h.keys[j] == k) from = h.rows + j * dim;
    }
    if (from == nullptr) {
      if (used < rest_n) from = rest + used * dim;
      ++used;
    }
    if (from != nullptr) std::memcpy(out + i * dim, from, row_bytes);
  }
  return used;
}

}  // namespace cpu_dist::ps
