// glibc malloc settings for MiB-sized RPC buffers.  Measured (docs/DESIGN.md, "Measured
// facts"): with the defaults every 1 MiB reply is a fresh mmap/munmap and page faults dominate
// a pull; raising the mmap and trim thresholds keeps those buffers in the heap and reuses them.
#pragma once

#include <malloc.h>

#include <mutex>

namespace cpu_dist::ps {

inline void tune_malloc_once() {
  static std::once_flag once;  // process-wide by nature: mallopt is process-wide
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  });
}

}  // namespace cpu_dist::ps
