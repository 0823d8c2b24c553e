// What a shard keeps per row besides its values: the optimizer accumulator (optimizer.h) and the
// job step of the row's last applied commit.  Both move with the row between the DRAM and SSD
// tiers (table.h, tier_store.h) and into checkpoints (checkpoint_format.h).
#pragma once

#include <cstdint>
#include <limits>

namespace cpu_dist::ps {

// The last-update step of a row no commit has updated: created by Push (which the step rules
// do not see) or loaded from a version 1 checkpoint.  Such a row never expires until a commit
// updates it.
inline constexpr int64_t kNoStep = std::numeric_limits<int64_t>::min();

}  // namespace cpu_dist::ps
