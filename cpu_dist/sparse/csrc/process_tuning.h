// Process-wide settings the client and the shard make once, before their first call.
//
// glibc malloc, for MiB-sized RPC buffers.  Measured (docs/DESIGN.md, "Measured facts"): with
// the defaults every 1 MiB reply is a fresh mmap/munmap and page faults dominate a pull;
// raising the mmap and trim thresholds keeps those buffers in the heap and reuses them.
//
// absl::Mutex's deadlock detector.  Debian's Abseil is built without NDEBUG, so every
// absl::Mutex (gRPC locks them on each call) records its lock order in a global cycle graph,
// a debugging aid that cost a 256-key pull about 3 % of its time here (GraphCycles in the
// profile of both processes).  A release build of Abseil has it off; so do we.
#pragma once

#include <malloc.h>

#include <mutex>

#include "absl/synchronization/mutex.h"

namespace cpu_dist::ps {

inline void tune_process_once() {
  static std::once_flag once;  // process-wide by nature: both settings are process-wide
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

}  // namespace cpu_dist::ps
