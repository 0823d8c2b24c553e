// A step's summed gradients applied to copies of rows outside the shard, with the shard's
// arithmetic: a worker that pulled rows before a commit was applied brings them up to date
// itself (--sparse-sync async, cpu_dist/train/pipelines.py) and gets the bits the shard gets.
#pragma once

#include <cstddef>
#include <cstdint>

#include "optimizer.h"

namespace cpu_dist::ps {

// For each of n rows: g = sums[i] / divisor (a commit divides the step's sums by its world
// size, commit.cc), then apply_row (optimizer.h) on rows[i] and its state: states + i for
// row-wise Adagrad, states + i * dim for Adagrad (states may be null for SGD).  Built with
// -ffp-contract=off, like the shard.
void apply_summed_rows(OptimizerKind kind, float lr, float divisor, const float* sums, float* rows,
                       float* states, size_t n, uint32_t dim, float eps = kDefaultAdagradEps);

}  // namespace cpu_dist::ps
