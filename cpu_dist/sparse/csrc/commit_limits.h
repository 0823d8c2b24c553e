// The commit protocol's limits that client and shard both check (proto/ps.proto,
// CommitRequest.max_ahead): one definition, in a header of neither side.
#pragma once

#include <cstdint>

namespace cpu_dist::ps {

// A shard accepts a commit chunk for a step at most this many steps beyond its committed one.
inline constexpr uint32_t kMaxCommitAhead = 64;

}  // namespace cpu_dist::ps
