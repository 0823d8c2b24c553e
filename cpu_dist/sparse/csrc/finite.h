// The one test of "is every gradient finite" that the client (before sending) and the shard
// (before storing or applying) both run.  Every gradient of every push and commit chunk passes
// here twice, so the common case (all finite) runs without a per-float branch: a block's flags
// are OR-ed (a loop the compiler vectorises) and only a block that holds a non-finite value is
// scanned for its first one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cpu_dist::ps {

// Index of the first of `n` floats at `data` (any alignment) whose exponent bits are all ones
// (NaN or infinity), or n.
inline size_t first_non_finite(const void* data, size_t n) {
  constexpr size_t kBlock = 64;
  constexpr uint32_t kExponent = 0x7f800000u;
  const char* bytes = static_cast<const char*>(data);
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t len = std::min(kBlock, n - start);
    uint32_t block[kBlock];
    std::memcpy(block, bytes + start * sizeof(float), len * sizeof(float));
    uint32_t any = 0;
    for (size_t i = 0; i < len; ++i)
      any |= static_cast<uint32_t>((block[i] & kExponent) == kExponent);
    if (any == 0) continue;
    for (size_t i = 0; i < len; ++i)
      if ((block[i] & kExponent) == kExponent) return start + i;
  }
  return n;
}

}  // namespace cpu_dist::ps
